"""Device meshes, logical-axis rules and shardings (see docs/architecture.md)."""
