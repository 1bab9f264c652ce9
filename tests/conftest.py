"""Shared pytest setup.

The model tests compare against transformers on the CPU in float32; JAX must not
silently use reduced-precision matmuls there.
"""
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
sys.path.insert(0, os.path.dirname(__file__))  # tests/hf_reference.py and friends
pytest_plugins = ["docker_fixtures"]
