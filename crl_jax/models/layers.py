"""Building blocks shared by crl_jax's models: logically-named params, RMSNorm, RoPE, attention.

Legend: B batch, T query time, S key slots, D model, N query heads, K kv heads, G = N / K query heads
per kv head, H head dim.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from crl_jax.models.config import RopeScaling

# A finite "minus infinity" keeps fully-masked rows (pad queries) finite instead of NaN.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def round_up(x: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= x (a padded length)."""
    return -(-x // multiple) * multiple


def param(value: jax.Array, logical_axes: tuple[str | None, ...]) -> nnx.Param:
    """An nnx.Param carrying its logical-axis names (see crl_jax/sharding.py) as metadata."""
    if len(logical_axes) != value.ndim:
        raise ValueError(f"{len(logical_axes)} logical axes {logical_axes} for a {value.ndim}-d param")
    return nnx.Param(value, logical_axes=tuple(logical_axes))


def normal_init(key: jax.Array, shape: tuple[int, ...], dtype, stddev: float = 0.02) -> jax.Array:
    return (stddev * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm computed in float32 and cast back, as the reference implementations do."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (weight.astype(jnp.float32) * normed).astype(x.dtype)


def dense(spec: str, x: jax.Array, w: jax.Array, chunk: int = 0, **kwargs) -> jax.Array:
    """`jnp.einsum(spec, x, w)` for a weight product whose contracted axes are the last of `x`
    and either the first of `w` ("btnh,nhd->btd") or its last ("btf,df->btd": weights stored
    [out, in]). With `chunk` > 0 the contraction of K terms is summed as K / chunk dots of
    `chunk` terms each, added one after another: a blocked summation whose float32 rounding
    error is a fraction of one long dot's on XLA's CPU backend (DecoderConfig.dot_chunk). Falls
    back to the single dot when K is not a multiple of `chunk`."""
    if not chunk:
        return jnp.einsum(spec, x, w, **kwargs)
    inputs, out = spec.split("->")
    x_axes, w_axes = inputs.split(",")
    contracted = "".join(a for a in w_axes if a in x_axes and a not in out)
    n = len(contracted)
    in_first = w_axes[:n] == contracted
    if x_axes[-n:] != contracted or not (in_first or w_axes[-n:] == contracted):
        raise ValueError(f"dense: {spec!r} must contract the last axes of x with the first or "
                         "the last of w")
    k = math.prod(w.shape[:n] if in_first else w.shape[-n:])
    if k <= chunk or k % chunk:
        return jnp.einsum(spec, x, w, **kwargs)
    lead, tail = x.shape[:-n], (w.shape[n:] if in_first else w.shape[:-n])
    xs = x.reshape(lead + (k,))
    if in_first:
        ws, piece_spec = w.reshape((k, math.prod(tail))), "...c,cv->...v"
        piece = lambda start: ws[start:start + chunk]
    else:
        ws, piece_spec = w.reshape((math.prod(tail), k)), "...c,vc->...v"
        piece = lambda start: ws[:, start:start + chunk]
    # One dot per chunk, added in order: no [.., K / chunk, out] partial product is materialised.
    out = None
    for start in range(0, k, chunk):
        part = jnp.einsum(piece_spec, xs[..., start:start + chunk], piece(start), **kwargs)
        out = part if out is None else out + part
    return out.reshape(lead + tail)


@jax.custom_vjp
def stacked_gate_and_up(x: jax.Array, w_gate: jax.Array, w_up: jax.Array):
    """The MLP's input projections `(x @ w_gate, x @ w_up)` for x [..., D] and weights [D, F], as
    one product with the weights stacked [D, 2, F]. The gradient is written out: the one JAX
    derives puts the stacked [N, 2F] cotangent on the left of the weight gradient's product,
    which XLA:CPU then pads together and copies transposed. Here each half takes its own
    products, with `x` [N, D] on the left of the weight gradients."""
    both = jnp.einsum("...d,dgf->...gf", x, jnp.stack([w_gate, w_up], axis=1))
    return both[..., 0, :], both[..., 1, :]


def _stacked_gate_and_up_fwd(x, w_gate, w_up):
    return stacked_gate_and_up(x, w_gate, w_up), (x, w_gate, w_up)


def _stacked_gate_and_up_bwd(residuals, cotangents):
    x, w_gate, w_up = residuals
    d_gate, d_up = cotangents
    dx = (jnp.einsum("...f,df->...d", d_gate, w_gate)
          + jnp.einsum("...f,df->...d", d_up, w_up))
    rows = math.prod(x.shape[:-1])
    flat = x.reshape(rows, x.shape[-1])

    def weight_grad(d, w):  # [N, D] x [N, F] -> [D, F], x on the left
        return jax.lax.dot_general(flat, d.reshape(rows, d.shape[-1]),
                                   (((0,), (0,)), ((), ()))).astype(w.dtype)

    return dx, weight_grad(d_gate, w_gate), weight_grad(d_up, w_up)


stacked_gate_and_up.defvjp(_stacked_gate_and_up_fwd, _stacked_gate_and_up_bwd)


def silu(x: jax.Array) -> jax.Array:
    """SiLU as x / (1 + exp(-x)), the formulation torch's kernel uses.

    jax.nn.silu lowers to x * logistic(x), which XLA on CPU evaluates slightly less accurately; on
    SmolLM2-135M, whose MLP at layer 11 writes residual activations of ~2.5e4, that difference alone
    moved the float32 logits from 1.3e-4 to 1.6e-4 off a float64 reference.
    """
    return x / (1 + jnp.exp(-x))


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> jax.Array:
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type != "llama3":
        raise ValueError(f"unsupported rope scaling type {scaling.rope_type!r} (llama3, linear)")
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, and the band between
    # is interpolated smoothly.
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return jnp.where(is_medium, smoothed, scaled)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """Rotary embedding in the Hugging Face "rotate half" layout. x: [B,T,*,H], positions [B,T]."""
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B,T,H/2]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x32 = x.astype(jnp.float32)
    # Halves by split, not by slicing: the gradient of a slice is a zero-padded copy of the
    # whole vector, added up with the other's, where split's is a concatenation.
    first, second = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-second, first], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array,
                      keys_transposed: bool = False) -> jax.Array:
    """Grouped-query attention. q [B,T,N,H], k/v [B,K,S,H] (k [B,K,H,S] if keys_transposed),
    mask [B,T,S] bool -> [B,T,N,H].

    Keys and values are kv-head-major, the KV cache's layout, so (b, k) are plain batch
    dimensions of both products and the cache is never transposed. The queries are moved to the
    same head-major layout (and the output back) outside the products: XLA's CPU dots are 2-8x
    slower when the time axis sits between batch dimensions, and these transposes are small.
    """
    b, t, n, h = q.shape
    kv_heads = k.shape[1]
    q = q.reshape(b, t, kv_heads, n // kv_heads, h).transpose(0, 2, 3, 1, 4)
    out = _softmax_attention(q, k, v, mask, keys_transposed)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h).astype(q.dtype)


def _key_subscripts(keys_transposed: bool) -> str:
    return "bkhs" if keys_transposed else "bksh"


def _attention_probs(q, k, mask, keys_transposed: bool):
    """softmax(q k^T / sqrt(H)) over the visible keys: [B,K,G,T,S] float32."""
    scores = jnp.einsum(f"bkgth,{_key_subscripts(keys_transposed)}->bkgts", q, k,
                        preferred_element_type=jnp.float32)
    scores = scores * (1.0 / math.sqrt(q.shape[-1]))
    scores = jnp.where(mask[:, None, None, :, :], scores, MASK_VALUE)
    return jax.nn.softmax(scores, axis=-1)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _softmax_attention(q, k, v, mask, keys_transposed: bool):
    """q [B,K,G,T,H] -> [B,K,G,T,H] float32. Its backward is written out (the standard softmax
    attention gradient, flash attention's form) because autodiff's keeps more than the
    probabilities for it (a [B,K,G,T,S] broadcast of the softmax's denominator) and reads the
    score-sized operands transposed: by hand, the micro preset's update at 1,280 tokens takes
    0.89-0.93 of the time and half the temporaries (docs/benchmarks.md)."""
    return _softmax_attention_fwd(q, k, v, mask, keys_transposed)[0]


def _softmax_attention_fwd(q, k, v, mask, keys_transposed: bool):
    probs = _attention_probs(q, k, mask, keys_transposed).astype(v.dtype)
    out = jnp.einsum("bkgts,bksh->bkgth", probs, v, preferred_element_type=jnp.float32)
    return out, (q, k, v, mask, probs, out)


def _softmax_attention_bwd(keys_transposed: bool, residuals, d_out):
    q, k, v, mask, probs, out = residuals
    d_out = d_out.astype(jnp.float32)
    d_out_low = d_out.astype(v.dtype)  # the products' input dtype (probs are cast to it too)
    # Products over (G, T) are taken as [H, S] = [H, GT] x [GT, S]: the score-sized operand is
    # then read as it lies and only the small one is transposed (and the small result after).
    # The barrier keeps XLA from folding that last transpose into the product, which it would
    # then take with both operands transposed, a form XLA:CPU's fast dot library declines.
    dv = _pinned(jnp.einsum("bkgth,bkgts->bkhs", d_out_low, probs,
                            preferred_element_type=jnp.float32)).swapaxes(2, 3)
    d_probs = jnp.einsum("bkgth,bksh->bkgts", d_out_low, v, preferred_element_type=jnp.float32)
    # The softmax's backward, with sum_s p d_probs = sum_h out d_out (out = p v); masked keys
    # get no gradient even in a row with no visible key (which the softmax spreads evenly over
    # the masked ones).
    row_dot = (d_out * out).sum(-1, keepdims=True)
    d_scores = jnp.where(mask[:, None, None, :, :],
                         probs.astype(jnp.float32) * (d_probs - row_dot), 0.0)
    d_scores = (d_scores * (1.0 / math.sqrt(q.shape[-1]))).astype(q.dtype)
    dq = jnp.einsum(f"bkgts,{_key_subscripts(keys_transposed)}->bkgth", d_scores, k,
                    preferred_element_type=jnp.float32)
    dk = jnp.einsum("bkgth,bkgts->bkhs", q, d_scores, preferred_element_type=jnp.float32)
    dk = dk if keys_transposed else _pinned(dk).swapaxes(2, 3)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


def _pinned(x: jax.Array) -> jax.Array:
    """x as computed on a CPU: no transpose after it is folded into the product that made it.
    Other backends' compilers keep their freedom."""
    return jax.lax.optimization_barrier(x) if jax.default_backend() == "cpu" else x


_softmax_attention.defvjp(_softmax_attention_fwd, _softmax_attention_bwd)


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array,
                     max_blocks: int = 8, min_block: int = 128) -> jax.Array:
    """Causal grouped-query attention over one whole sequence (no cache).

    q [B,T,N,H], k/v [B,K,T,H], key_mask [B,T] bool (False for padding) -> [B,T,N,H]; query t sees
    keys s <= t that are not padding. The queries are cut into at most `max_blocks` blocks and each
    block is scored only against the keys up to its end, so the masked upper triangle is mostly
    never computed: about 1.8x faster forward and backward at T=768 on a CPU, and equal to
    `grouped_attention` with the full causal mask (keys past the block end would get weight 0).

    On a single CPU device the batch is taken a few rows at a time (`_rows_per_chunk`), so that
    the score-sized temporaries of the softmax and of its backward stay in cache.
    """
    batch, t, heads = q.shape[:3]
    block = max(min_block, -(-t // max_blocks))
    # The largest query block's float32 scores, per batch row.
    rows = _rows_per_chunk(batch, heads * min(block, t) * t * jnp.dtype(jnp.float32).itemsize)
    if rows == batch:
        return _causal_blocks(q, k, v, key_mask, block)
    chunked = lambda x: x.reshape((batch // rows, rows) + x.shape[1:])
    out = jax.lax.map(lambda xs: _causal_blocks(*xs, block),
                      (chunked(q), chunked(k), chunked(v), chunked(key_mask)))
    return out.reshape(q.shape)


# Score bytes of one chunk's largest query block on a CPU: about one core's L2 cache. Batches
# with up to CPU_WHOLE_BATCH_CHUNKS chunks' worth stay whole: the map's steps cost more than they
# save there (32 windows of 96 tokens: 1.047 of the time in two chunks). The micro preset's
# update at 1,024-1,280 tokens takes 0.90-0.92 of the time with chunks (docs/benchmarks.md).
CPU_SCORE_CHUNK_BYTES = 4 * 2**20
CPU_WHOLE_BATCH_CHUNKS = 4


def _rows_per_chunk(batch: int, score_bytes_per_row: int) -> int:
    """Batch rows per chunk of `causal_attention`: the whole batch except on a lone CPU device
    (a sharded batch, or an accelerator's kernels, are left as they are) with large scores."""
    mesh = jax.sharding.get_abstract_mesh()
    if (jax.default_backend() != "cpu" or (not mesh.empty and mesh.size > 1)
            or batch * score_bytes_per_row <= CPU_WHOLE_BATCH_CHUNKS * CPU_SCORE_CHUNK_BYTES):
        return batch
    fits = max(1, CPU_SCORE_CHUNK_BYTES // score_bytes_per_row)
    return max(c for c in range(1, min(batch, fits) + 1) if batch % c == 0)


def _causal_blocks(q, k, v, key_mask, block: int):
    """`causal_attention` over query blocks of `block`, each against the keys up to its end."""
    t = q.shape[1]
    outputs = []
    for start in range(0, t, block):
        end = min(start + block, t)
        mask = key_mask[:, None, :end] & (jnp.arange(start, end)[:, None] >= jnp.arange(end)[None, :])
        outputs.append(grouped_attention(q[:, start:end], k[:, :, :end], v[:, :, :end], mask))
    return outputs[0] if len(outputs) == 1 else jnp.concatenate(outputs, axis=1)
