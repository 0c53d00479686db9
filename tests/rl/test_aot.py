"""AOT compilation of the joint train step for a TPU topology, without a TPU (needs libtpu)."""
import math

import jax
import numpy as np
import pytest

pytest.importorskip("libtpu")

from crl_jax import models  # noqa: E402
from crl_jax.rl import aot  # noqa: E402
from crl_jax.rl import train_step as ts  # noqa: E402


def test_joint_step_compiles_for_v5e_2x2_with_sharded_state():
    actor = models.get_preset("tiny", vocab_size=256, hidden_size=64, intermediate_size=128,
                              num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16,
                              dtype="bfloat16", remat="full")
    extractor = actor.replace(model_type="qwen3", qkv_bias=False, qk_norm=True)
    spec = aot.AotSpec(actor, extractor, actor_batch=8, actor_seq=32, extractor_batch=4,
                       extractor_seq=32, train=ts.TrainConfig(actor_micro_batches=2,
                                                              logprob_chunk=16))
    report = aot.compile_train_step(spec, "v5e:2x2", (1, 2, 2))
    assert report["chips"] == 4 and "v5" in report["device_kind"].lower()
    assert report["fits"] and report["flops_per_chip"] > 0

    # Per-chip arguments are the *sharded* states plus a batch shard: less than the unsharded
    # states (replicated states would exceed them; TPU tile padding of these small shards keeps
    # the saving well short of 4x, so no exact byte count is asserted).
    full_bytes = sum(
        math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
        for cfg in (actor, extractor)
        for leaf in jax.tree.leaves(aot.abstract_state(cfg, spec.optimizer)))
    assert 0 < report["argument_bytes"] < full_bytes
    # The donated states are aliased to the new states, not copied.
    assert report["alias_bytes"] > 0.9 * (report["output_bytes"] - 4096)


def _small(attention: str, **overrides):
    return models.get_preset("tiny", vocab_size=256, hidden_size=256, intermediate_size=256,
                             num_layers=1, num_heads=4, num_kv_heads=2, head_dim=128,
                             dtype="bfloat16", remat="full", attention=attention, **overrides)


@pytest.mark.parametrize("context_parallel", [False, True])
def test_joint_step_with_splash_attention_compiles_for_v5e_2x2(context_parallel):
    """Splash under shard_map (heads over tensor; with context parallelism queries split along T
    over fsdp), forward and backward, compiled for a real TPU topology."""
    model = _small("splash", context_parallel=context_parallel)
    micro = 4 if context_parallel else 2  # one sequence per micro-batch when split along T
    spec = aot.AotSpec(model, model, actor_batch=4, actor_seq=1024, extractor_batch=4,
                       extractor_seq=1024, train=ts.TrainConfig(
                           actor_micro_batches=micro, extractor_micro_batches=micro,
                           logprob_chunk=512, context_parallel=context_parallel))
    report = aot.compile_train_step(spec, "v5e:2x2", (1, 2, 2))
    assert report["fits"] and report["flops_per_chip"] > 0


def test_sampler_with_blockwise_prefill_compiles_for_v5e_2x2():
    from crl_jax.sampling import aot as sampler_aot

    report = sampler_aot.compile_sampler(_small("auto"), "v5e:2x2", (1, 2, 2), batch=4,
                                         prompt_len=4096, cache_length=8192, max_new_tokens=64)
    assert report["fits"] and report["argument_bytes"] > 0
