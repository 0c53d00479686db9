"""Memory sizing agrees with the bytes real arrays take, whole and per device."""

import jax
import numpy as np
import pytest
from flax import nnx

from crl_jax import models, sampling
from crl_jax.sharding import make_mesh


def test_report_matches_allocated_params_and_cache():
    cfg = models.get_preset("tiny")
    report = sampling.memory_report("tiny", batch=4, cache_length=32)
    _, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))
    assert report["params"] == sum(x.nbytes for x in jax.tree.leaves(params))
    cache = models.init_cache(cfg, 4, 32)
    assert report["kv_cache"] == sum(x.nbytes for x in jax.tree.leaves(cache))
    assert sampling.kv_cache_bytes(cfg, 4, 32) == report["kv_cache"]
    assert report["total"] == pytest.approx(sum(report[k] for k in (
        "params", "kv_cache", "prefill_scores", "prefill_activations", "logits")))


def test_per_device_figures_match_real_shards():
    cfg = models.get_preset("tiny")
    mesh = make_mesh((2, 2, 2))
    spec = sampling.SamplerSpec(cache_length=32, max_new_tokens=4)
    state = sampling.init_state(cfg, 8, spec, mesh=mesh)
    report = sampling.memory_report(cfg, batch=8, cache_length=32, mesh_shape=(2, 2, 2))
    shard = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(state.cache))
    assert report["kv_cache_per_device"] == shard
    # k/v split 8 ways (batch over data x fsdp, kv heads over tensor); valid/end only 4 ways.
    assert report["kv_cache_per_device"] == pytest.approx(report["kv_cache"] / 8, rel=1e-3)


def test_paper_scale_actor_in_bfloat16():
    batch, length = 128, 32768
    report = sampling.memory_report("qwen2.5-7b", batch=batch, cache_length=length,
                                    dtype="bfloat16", param_dtype="bfloat16", prefill_chunk=1024)
    cfg = models.get_preset("qwen2.5-7b")
    assert report["params"] == cfg.num_params() * 2
    assert 7.6e9 < cfg.num_params() < 7.7e9
    kv = 2 * 28 * batch * length * 4 * 128 * 2
    np.testing.assert_allclose(report["kv_cache"], kv + batch * length + 4 * batch)
    assert report["total_gib"] > 224  # the cache alone is 224 GiB: it does not fit one chip


def test_bad_requests_raise_clear_errors():
    with pytest.raises(KeyError, match="unknown preset"):
        sampling.memory_report("gpt-17", batch=1, cache_length=8)
    with pytest.raises(ValueError, match="batch and cache_length"):
        sampling.memory_report("tiny", batch=0, cache_length=8)
    with pytest.raises(ValueError, match="mesh_shape"):
        sampling.memory_report("tiny", batch=1, cache_length=8, mesh_shape=(2, 2))
