"""model/cache.py write_slots: per-row writes; slots past the end are dropped, never clamped."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from reterm_jax.model.cache import write_slots


def _reference(buffer, values, index):
    out = buffer.copy()
    for r in range(buffer.shape[0]):
        for j in range(values.shape[1]):
            if index[r] + j < buffer.shape[1]:  # slots past the end are dropped
                out[r, index[r] + j] = values[r, j]
    return out


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("t", [1, 5])
def test_write_slots_matches_a_per_slot_reference_including_rows_at_the_end(dtype, t):
    rng = np.random.default_rng(t)
    length = 12
    buffer = rng.standard_normal((6, length, 3)).astype(dtype)
    values = rng.standard_normal((6, t, 3)).astype(dtype)
    index = np.array([0, 3, length - t, length - 2, length - 1, length], np.int32)  # fits, crosses, full
    got = jax.jit(write_slots)(jnp.asarray(buffer), jnp.asarray(values), jnp.asarray(index))
    np.testing.assert_array_equal(np.asarray(got), _reference(buffer, values, index))
