"""Shared pieces of the rollout / GRPO tests: a random tiny model behind a Sampler that speaks the
bundled tiny tokenizer."""
from flax import nnx

from reterm_jax.data import special_ids
from reterm_jax.model import Qwen3_5Config, Qwen3_5ForCausalLM
from reterm_jax.rl.inference.sampler import Sampler


def tiny_sampler(tok, max_length: int, model=None) -> Sampler:
    """A Sampler over `model` (default: a random tiny Qwen3.5 sized to `tok`'s vocabulary)."""
    if model is None:
        model = Qwen3_5ForCausalLM(Qwen3_5Config.tiny(vocab_size=len(tok)), rngs=nnx.Rngs(0))
    ids = special_ids(tok)
    return Sampler(model, stop_ids=ids.stop, pad_id=ids.pad, max_length=max_length, min_bucket=32)
