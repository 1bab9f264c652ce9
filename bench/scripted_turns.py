"""The scripted policy of the rollout benchmarks: turns of varied length that run real commands in
the sandbox (1-4 commands an attempt, then a final answer), deterministic per episode, so every
engine and setting produces the same trajectories and only the scheduling differs."""
from reterm_jax.rl.agent.harness import bash_call_xml

COMMANDS = ["ls -la /app", "find /app -maxdepth 2 -type f | head -20", "wc -c /app/* 2>/dev/null | tail -3",
            "cat /app/*.txt 2>/dev/null | head -15", "sleep 0.3; date"]


def scripted_turns(episode: int) -> list[str]:
    """1-4 commands with reasoning of varied length, then a final answer (deterministic per episode)."""
    n = 1 + episode % 4
    turns = []
    for k in range(n):
        think = "Let me look at the files before I change anything. " * (1 + (episode + 2 * k) % 3)
        turns.append(f"{think}\n</think>\n\n" + bash_call_xml(COMMANDS[(episode + k) % len(COMMANDS)]) + "<|im_end|>")
    turns.append("Checked.\n</think>\n\nThe task is complete.<|im_end|>")
    return turns
