"""Blocked causal attention equals attention under the full causal-and-padding mask (real queries)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax.models import layers


@pytest.mark.parametrize("time,min_block", [(37, 8), (64, 16), (20, 128)])
def test_causal_attention_matches_full_mask(time, min_block):
    b, n, kv, h = 3, 4, 2, 8
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (b, time, n, h))
    k = jax.random.normal(keys[1], (b, kv, time, h))
    v = jax.random.normal(keys[2], (b, kv, time, h))
    key_mask = np.ones((b, time), bool)
    key_mask[1, time - 5:] = False   # right padding
    key_mask[2, :4] = False          # left padding
    full = key_mask[:, None, :] & np.tril(np.ones((time, time), bool))[None]
    expected = layers.grouped_attention(q, k, v, jnp.asarray(full))
    got = layers.causal_attention(q, k, v, jnp.asarray(key_mask), max_blocks=4, min_block=min_block)
    # Padding queries see no key at all; their outputs are never read, so only real ones count.
    np.testing.assert_allclose(np.asarray(got)[key_mask], np.asarray(expected)[key_mask], atol=1e-6)
