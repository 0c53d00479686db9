"""The sampler's empty state: on a mesh, one compiled program per shape, whatever the seed and the
first row (a run builds a state for every batch of conversations), with the seed and rows each
call asked for."""

import jax
import numpy as np

from crl_jax import models, sampling
from crl_jax.sampling import engine
from crl_jax.sharding import make_mesh


def test_states_of_one_shape_share_one_program_and_keep_their_seed_and_rows():
    cfg = models.get_preset("tiny")
    mesh = make_mesh((2, 2, 2))
    spec = sampling.SamplerSpec(cache_length=32, max_new_tokens=4)
    states = [sampling.init_state(cfg, 8, spec, seed=seed, mesh=mesh, first_row=first)
              for seed, first in ((0, 0), (7, 8), (3, 16))]
    assert engine._state_maker(cfg, 8, 32, None, mesh)._cache_size() == 1
    for state, (seed, first) in zip(states, ((0, 0), (7, 8), (3, 16))):
        np.testing.assert_array_equal(np.asarray(state.rows), np.arange(8) + first)
        np.testing.assert_array_equal(jax.random.key_data(state.rng),
                                      jax.random.key_data(jax.random.key(seed)))
        assert not state.cache.k.sharding.is_fully_replicated  # born sharded over the mesh
        assert not np.asarray(state.cache.k).any()
    unsharded = sampling.init_state(cfg, 8, spec, seed=7, first_row=8)  # no mesh: no jit
    np.testing.assert_array_equal(np.asarray(unsharded.rows), np.asarray(states[1].rows))
