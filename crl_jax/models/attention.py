"""Causal grouped-query attention: one entry point, implementations chosen by config.

    attention(q, k, v, key_valid, q_slots=None, implementation="auto")

q [B,T,N,H]; k, v [B,K,S,H] (kv-head-major, the KV cache's layout); key_valid [B,S] bool (False
for padding and empty cache slots). Query t sits at slot `q_slots[b, t]` (default: t, a whole
sequence attending to itself) and sees the keys s <= that slot which are valid. A padding query
has an unspecified output (splash lets it see only padding, the others what a real query there
would see, or nothing: 0); callers never read it.

Implementations (`IMPLEMENTATIONS`):
- `materialized`: scores [B,N,T,S] in one piece. The reference, and the fastest on a CPU for short
  sequences; without a cache it scores query blocks only against the keys up to their end.
- `blockwise`: an online softmax over key blocks in pure JAX (flash attention's algorithm), with
  a hand-written backward pass, so forward and backward hold O(T) memory rather than O(T^2). Key
  blocks past a query block's last slot are never visited. Any backend, any T, GQA, any H.
- `splash`: Pallas splash attention on TPU (`crl_jax.models.splash`), heads and batch sharded.
- `cudnn`: cuDNN flash attention on GPU through `jax.nn.dot_product_attention`.
  These two take whole sequences; queries against a KV cache then use what `auto` picks there.
- `auto`: splash on TPU (with a mesh in context, as the train step sets) and cuDNN on GPU for a
  whole sequence; otherwise materialized below `BLOCKWISE_FROM` scored slots, blockwise above.

Legend: B batch, T queries, S keys, N query heads, K kv heads, G = N / K, H head dim.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from crl_jax.models.config import ATTENTION_IMPLEMENTATIONS as IMPLEMENTATIONS
from crl_jax.models.layers import MASK_VALUE, causal_attention, grouped_attention, round_up

# T x S from which `auto` stops materialising scores on a CPU. At 4,096 x 4,096 blockwise is
# faster (1.47x for the tiny preset's update, with 0.30x the memory: benchmarks/attention.py);
# below it, the embedded settings (at most 2,816 tokens) keep the code their records were made with.
BLOCKWISE_FROM = 4096 * 4096


def attention(q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array,
              q_slots: jax.Array | None = None, *, implementation: str = "auto",
              block: int = 512, context_parallel: bool = False,
              keys_transposed: bool = False) -> jax.Array:
    """Causal grouped-query attention [B,T,N,H]; see the module docstring. keys_transposed: k is
    [B,K,H,S] (a per-layer decode cache, `decoder.split_cache_layers`)."""
    b, t, n, h = q.shape
    s = k.shape[3 if keys_transposed else 2]
    impl = resolve(implementation, t, s, whole_sequence=q_slots is None)
    if q_slots is not None and impl in ("splash", "cudnn"):
        # Whole-sequence kernels: queries against a KV cache (the sampler) take the portable path.
        impl = resolve("auto", t, s, whole_sequence=False)
    if impl == "materialized" and q_slots is not None:
        visible = key_valid[:, None, :] & (jnp.arange(s)[None, None, :] <= q_slots[:, :, None])
        return grouped_attention(q, k, v, visible, keys_transposed=keys_transposed)
    if keys_transposed:  # the other implementations read [B,K,S,H] keys
        k = jnp.swapaxes(k, 2, 3)
    if impl == "materialized":
        return causal_attention(q, k, v, key_valid)
    if impl == "splash":
        from crl_jax.models import splash
        return splash.splash_attention(q, k, v, key_valid, block=block,
                                       context_parallel=context_parallel)
    if impl == "cudnn":
        return _cudnn(q, k, v, key_valid, "cudnn")
    if q_slots is None:
        q_slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    return blockwise_attention(q, k, v, key_valid, q_slots, block=block)


def resolve(implementation: str, t: int, s: int, whole_sequence: bool) -> str:
    """The implementation `auto` stands for on this backend, for T queries over S keys."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation must be one of {IMPLEMENTATIONS}, "
                         f"got {implementation!r}")
    if implementation != "auto":
        return implementation
    backend = jax.default_backend()
    # Splash shards itself over the mesh in context; without one, blockwise leaves it to GSPMD.
    if whole_sequence and backend == "tpu" and not jax.sharding.get_abstract_mesh().empty:
        return "splash"
    if whole_sequence and backend == "gpu":
        return "cudnn"
    return "materialized" if t * s < BLOCKWISE_FROM else "blockwise"


def _cudnn(q, k, v, key_valid, implementation):
    """jax.nn.dot_product_attention with causal and key-padding masks (q, k, v in its [B,T,N,H])."""
    mask = key_valid[:, None, None, :]  # [B,1,1,S], broadcast by the kernel, never [T,S]
    out = jax.nn.dot_product_attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
                                       mask=mask, is_causal=True, implementation=implementation)
    return out.astype(q.dtype)


def blockwise_attention(q, k, v, key_valid, q_slots, *, block: int = 512):
    """The `blockwise` implementation; q_slots [B,T] int is required here."""
    b, t, n, h = q.shape
    kv_heads, s = k.shape[1], k.shape[2]
    bq, bk = min(block, round_up(t, 8)), min(block, round_up(s, 8))
    tp, sp = round_up(t, bq), round_up(s, bk)
    qg = q.reshape(b, t, kv_heads, n // kv_heads, h).transpose(0, 2, 3, 1, 4)  # [B,K,G,T,H]
    qg = jnp.pad(qg, ((0, 0),) * 3 + ((0, tp - t), (0, 0)))
    slots = jnp.pad(q_slots.astype(jnp.int32), ((0, 0), (0, tp - t)), constant_values=-1)
    kp = jnp.pad(k, ((0, 0), (0, 0), (0, sp - s), (0, 0)))
    vp = jnp.pad(v, ((0, 0), (0, 0), (0, sp - s), (0, 0)))
    valid = jnp.pad(key_valid.astype(bool), ((0, 0), (0, sp - s)))
    out = _flash(qg, kp, vp, slots, valid, bq, bk)[:, :, :, :t]
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


def _visible(slots_i, valid, j, bk):
    """[B,bq,bk] mask of key block j for queries at slots_i [B,bq]."""
    key_slot = j * bk + jnp.arange(bk)
    valid_j = jax.lax.dynamic_slice_in_dim(valid, j * bk, bk, axis=1)
    return valid_j[:, None, :] & (key_slot[None, None, :] <= slots_i[:, :, None])


def _key_block(x, j, bk):
    return jax.lax.dynamic_slice_in_dim(x, j * bk, bk, axis=2)


def _query_block(x, i, bq, axis=3):
    return jax.lax.dynamic_slice_in_dim(x, i * bq, bq, axis=axis)


def _scores(qi, kj, visible, scale):
    s = jnp.einsum("bkgth,bksh->bkgts", qi, kj, preferred_element_type=jnp.float32) * scale
    return jnp.where(visible[:, None, None], s, MASK_VALUE)


def _key_blocks_seen(slots, bq, bk, nk):
    """Per query block, how many key blocks any of its queries sees (the loop's end)."""
    last = slots.reshape(slots.shape[0], -1, bq).max(axis=(0, 2))  # [nq]
    return jnp.clip(last // bk + 1, 0, nk), last


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _flash(q, k, v, slots, valid, bq, bk):
    return _flash_forward(q, k, v, slots, valid, bq, bk)[0]


def _flash_forward(q, k, v, slots, valid, bq, bk):
    """Online softmax over key blocks. q [B,K,G,Tp,H] -> (out like q, log-sum-exp [B,K,G,Tp])."""
    nq, nk = q.shape[3] // bq, k.shape[2] // bk
    scale = 1.0 / math.sqrt(q.shape[-1])
    ends, _ = _key_blocks_seen(slots, bq, bk, nk)

    def query_block(i):
        qi, slots_i = _query_block(q, i, bq), _query_block(slots, i, bq, axis=1)

        def key_step(j, carry):
            m, l, acc = carry
            visible = _visible(slots_i, valid, j, bk)
            s = _scores(qi, _key_block(k, j, bk), visible, scale)
            m_new = jnp.maximum(m, s.max(axis=-1))
            p = jnp.where(visible[:, None, None], jnp.exp(s - m_new[..., None]), 0.0)
            correction = jnp.exp(m - m_new)
            pv = jnp.einsum("bkgts,bksh->bkgth", p.astype(v.dtype), _key_block(v, j, bk),
                            preferred_element_type=jnp.float32)
            return m_new, l * correction + p.sum(axis=-1), acc * correction[..., None] + pv

        shape = qi.shape[:-1]
        m, l, acc = jax.lax.fori_loop(0, ends[i], key_step, (
            jnp.full(shape, MASK_VALUE, jnp.float32), jnp.zeros(shape, jnp.float32),
            jnp.zeros(qi.shape, jnp.float32)))
        seen = l > 0  # a query that sees no key outputs 0
        out = jnp.where(seen[..., None], acc / jnp.where(seen, l, 1.0)[..., None], 0.0)
        return out.astype(q.dtype), jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), MASK_VALUE)

    outs, lses = jax.lax.map(query_block, jnp.arange(nq))  # [nq,B,K,G,bq,...]
    out = jnp.moveaxis(outs, 0, 3).reshape(q.shape)
    lse = jnp.moveaxis(lses, 0, 3).reshape(q.shape[:-1])
    return out, lse


def _flash_fwd(q, k, v, slots, valid, bq, bk):
    out, lse = _flash_forward(q, k, v, slots, valid, bq, bk)
    return out, (q, k, v, slots, valid, out, lse)


def _flash_bwd(bq, bk, residuals, d_out):
    """Flash attention's backward: scores are recomputed block by block from the saved
    log-sum-exp; dq in a pass over query blocks, dk and dv in a pass over key blocks."""
    q, k, v, slots, valid, out, lse = residuals
    nq, nk = q.shape[3] // bq, k.shape[2] // bk
    scale = 1.0 / math.sqrt(q.shape[-1])
    ends, last = _key_blocks_seen(slots, bq, bk, nk)
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # [B,K,G,Tp]

    def probs_and_dscores(i, j):
        qi, slots_i = _query_block(q, i, bq), _query_block(slots, i, bq, axis=1)
        do_i = _query_block(d_out, i, bq)
        visible = _visible(slots_i, valid, j, bk)
        s = _scores(qi, _key_block(k, j, bk), visible, scale)
        p = jnp.where(visible[:, None, None], jnp.exp(s - _query_block(lse, i, bq)[..., None]), 0.0)
        dp = jnp.einsum("bkgth,bksh->bkgts", do_i, _key_block(v, j, bk),
                        preferred_element_type=jnp.float32)
        return qi, do_i, p, p * (dp - _query_block(delta, i, bq)[..., None])

    def dq_block(i):
        def step(j, dq):
            _, _, _, ds = probs_and_dscores(i, j)
            return dq + jnp.einsum("bkgts,bksh->bkgth", ds, _key_block(k, j, bk).astype(jnp.float32))
        shape = q.shape[:3] + (bq, q.shape[-1])
        return (jax.lax.fori_loop(0, ends[i], step, jnp.zeros(shape, jnp.float32)) * scale).astype(q.dtype)

    def dkv_block(j):
        # The first query block any of whose queries reaches key block j; padding blocks (slot -1)
        # at the end are visited but see nothing.
        reaches = last >= j * bk
        first = jnp.where(jnp.any(reaches), jnp.argmax(reaches), nq)

        def step(i, carry):
            dk, dv = carry
            qi, do_i, p, ds = probs_and_dscores(i, j)
            dv = dv + jnp.einsum("bkgts,bkgth->bksh", p, do_i.astype(jnp.float32))
            dk = dk + jnp.einsum("bkgts,bkgth->bksh", ds, qi.astype(jnp.float32))
            return dk, dv

        zeros = jnp.zeros(k.shape[:2] + (bk, k.shape[-1]), jnp.float32)
        dk, dv = jax.lax.fori_loop(first, nq, step, (zeros, zeros))
        return (dk * scale).astype(k.dtype), dv.astype(v.dtype)

    dq = jnp.moveaxis(jax.lax.map(dq_block, jnp.arange(nq)), 0, 3).reshape(q.shape)
    dks, dvs = jax.lax.map(dkv_block, jnp.arange(nk))  # [nk,B,K,bk,H]
    dk = jnp.moveaxis(dks, 0, 2).reshape(k.shape)
    dv = jnp.moveaxis(dvs, 0, 2).reshape(v.shape)
    return dq, dk, dv, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)
