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
from crl_jax.models.layers import round_up


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, *,
                     block: int = 512, context_parallel: bool = False) -> jax.Array:
    """q [B,T,N,H], k/v [B,K,T,H], key_valid [B,T] -> [B,T,N,H], causal. With context_parallel
    (and a mesh in context) the queries stay split along T over the `context` rule's mesh axis and
    the keys and values are all-gathered, as MaxText's default context parallelism does."""
    b, t, n, h = q.shape
    mesh = jax.sharding.get_abstract_mesh()
    context = sharding.LOGICAL_RULES["context"]
    shards = mesh.shape[context] if context_parallel and not mesh.empty else 1
    block = min(block, round_up(-(-t // shards), 128))
    tp = round_up(t, block * shards)
    pad = ((0, 0), (0, 0), (0, tp - t), (0, 0))
    qh = jnp.pad((q * (1.0 / math.sqrt(h))).astype(q.dtype).transpose(0, 2, 1, 3), pad)  # [B,N,T,H]
    kh, vh = jnp.pad(k, pad), jnp.pad(v, pad)
    segments = jnp.pad(key_valid.astype(jnp.int32), ((0, 0), (0, tp - t)))
    if mesh.empty:
        out = _per_example(qh, kh, vh, segments, block=block)
    elif shards > 1:
        out = _context_parallel(qh, kh, vh, segments, mesh, block, shards)
    else:
        batch_axes = sharding.LOGICAL_RULES["batch"]
        heads = sharding.LOGICAL_RULES["heads"]
        spec4, spec2 = P(batch_axes, heads, None, None), P(batch_axes, None)
        out = jax.shard_map(functools.partial(_per_example, block=block), mesh=mesh,
                            in_specs=(spec4, spec4, spec4, spec2), out_specs=spec4,
                            check_vma=False)(qh, kh, vh, segments)
    return out[:, :, :t].transpose(0, 2, 1, 3)


def _context_parallel(q, k, v, segments, mesh, block, shards):
    """Queries split along T over the context axis, keys and values whole on every shard. The
    kernel is built for the whole (T, T) causal mask with `q_seq_shards` and passed through
    shard_map, which hands each shard the mask blocks of its own queries."""
    batch_axes = sharding.LOGICAL_RULES["context_batch"]
    heads, context = sharding.LOGICAL_RULES["heads"], sharding.LOGICAL_RULES["context"]
    kernel = _kernel(q.shape[1], q.shape[2], block, shards)
    kernel_spec = kernel.manual_sharding_spec(jax.sharding.NamedSharding(mesh, P(None, context)))
    q_spec, kv_spec = P(batch_axes, heads, context, None), P(batch_axes, heads, None, None)

    def local(kernel, q, k, v, seg_q, seg_kv):
        from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as lib
        one = lambda q, k, v, sq, skv: kernel(q, k, v, segment_ids=lib.SegmentIds(q=sq, kv=skv))  # noqa: E731
        return jax.vmap(one)(q, k, v, seg_q, seg_kv).astype(q.dtype)

    return jax.shard_map(local, mesh=mesh, out_specs=q_spec, check_vma=False, in_specs=(
        kernel_spec, q_spec, kv_spec, kv_spec, P(batch_axes, context), P(batch_axes, None)))(
        kernel, q, k, v, segments, segments)


def _kernel(heads: int, t: int, block: int, q_seq_shards: int = 1):
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as mask_lib

    mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((t, t)) for _ in range(heads)])
    sizes = kernel_lib.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                                  block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                                  block_q_dq=block, block_kv_dq=block)
    return kernel_lib.make_splash_mha(mask=mask, block_sizes=sizes, head_shards=1,
                                      q_seq_shards=q_seq_shards,
                                      interpret=jax.default_backend() != "tpu")


def _per_example(q, k, v, segments, *, block):
    """The kernel over a (local) batch: q [B,N,T,H], k/v [B,K,T,H], segments [B,T]."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel_lib

    kernel = _kernel(q.shape[1], q.shape[2], block)

    def one(q, k, v, seg):
        return kernel(q, k, v, segment_ids=kernel_lib.SegmentIds(q=seg, kv=seg))

    return jax.vmap(one)(q, k, v, segments).astype(q.dtype)
