"""Splash attention (Pallas, TPU) for a whole causal sequence, sharded like the rest of the model.

The kernel runs per example and per head shard: under `shard_map` over the mesh in context
(`jax.set_mesh`), the batch is split over the mesh's batch axes and the query and kv heads over
`tensor`, the same split the logical-axis rules give activations (crl_jax/sharding.py). Without a
mesh in context it runs on the whole arrays. Padding becomes segment ids: real tokens are segment
1 and padding 0, so a real query never sees a padding key, and every query sees at least itself
(the kernel's softmax needs a non-empty row). T is padded up to a multiple of the block.

On a CPU the kernel runs in Pallas interpret mode (slow; numerics tests only).

Legend: B batch, T time, N query heads, K kv heads, H head dim.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from crl_jax import sharding


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, *,
                     block: int = 512) -> jax.Array:
    """q [B,T,N,H], k/v [B,K,T,H], key_valid [B,T] -> [B,T,N,H], causal."""
    b, t, n, h = q.shape
    block = min(block, _round_up(t, 128))
    tp = _round_up(t, block)
    pad = ((0, 0), (0, 0), (0, tp - t), (0, 0))
    qh = jnp.pad((q * (1.0 / math.sqrt(h))).astype(q.dtype).transpose(0, 2, 1, 3), pad)  # [B,N,T,H]
    kh, vh = jnp.pad(k, pad), jnp.pad(v, pad)
    segments = jnp.pad(key_valid.astype(jnp.int32), ((0, 0), (0, tp - t)))
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        out = _per_example(qh, kh, vh, segments, block=block)
    else:
        batch_axes = sharding.LOGICAL_RULES["batch"]
        heads = sharding.LOGICAL_RULES["heads"]
        spec4, spec2 = P(batch_axes, heads, None, None), P(batch_axes, None)
        out = jax.shard_map(functools.partial(_per_example, block=block), mesh=mesh,
                            in_specs=(spec4, spec4, spec4, spec2), out_specs=spec4,
                            check_vma=False)(qh, kh, vh, segments)
    return out[:, :, :t].transpose(0, 2, 1, 3)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _per_example(q, k, v, segments, *, block):
    """The kernel over a (local) batch: q [B,N,T,H], k/v [B,K,T,H], segments [B,T]."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

    heads, t = q.shape[1], q.shape[2]
    mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((t, t)) for _ in range(heads)])
    sizes = kernel_lib.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                                  block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                                  block_q_dq=block, block_kv_dq=block)
    kernel = kernel_lib.make_splash_mha(mask=mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                        interpret=jax.default_backend() != "tpu")

    def one(q, k, v, seg):
        return kernel(q, k, v, segment_ids=kernel_lib.SegmentIds(q=seg, kv=seg))

    return jax.vmap(one)(q, k, v, segments).astype(q.dtype)
