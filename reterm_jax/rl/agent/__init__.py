"""The agent: the single-bash-tool harness (prompt, tool-call parsing, observations, limits), the
trajectory record, the episode engines (lockstep `rollout`, continuous batching over slots) and
scripted attempts (a task's solve.sh or fault commands run as tool calls)."""
