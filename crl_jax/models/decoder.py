"""The decoder-only transformer for the Llama / Qwen2 / Qwen2.5 / Qwen3 family, and its KV cache.

Layers are stored stacked (a leading "layers" axis on every per-layer weight) and run with
`lax.scan`, so compile time does not grow with depth; each layer body can be rematerialised.

Legend: B batch, T chunk time, S cache slots, L layers, D model, F MLP width, N query heads,
K kv heads, H head dim, V vocab.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx, struct

from crl_jax import sharding
from crl_jax.models import attention, layers
from crl_jax.models.config import DecoderConfig

_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


@struct.dataclass
class KVCache:
    """Preallocated keys/values of every layer. Slots are written left to right per row.

    k, v: [L,B,K,S,H] (kv heads before slots, so attention reads the cache without a transpose),
    or in the per-layer form of `split_cache_layers`, tuples of L arrays: k [B,K,H,S], v [B,K,S,H];
    valid: [B,S] whether a slot holds a real token; end: [B] next free slot.
    """

    k: jax.Array
    v: jax.Array
    valid: jax.Array
    end: jax.Array

    @property
    def max_len(self) -> int:
        return self.valid.shape[1]


def init_cache(cfg: DecoderConfig, batch_size: int, max_len: int, dtype=None) -> KVCache:
    dtype = dtype or cfg.compute_dtype
    shape = (cfg.num_layers, batch_size, cfg.num_kv_heads, max_len, cfg.head_dim)
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                   valid=jnp.zeros((batch_size, max_len), bool),
                   end=jnp.zeros((batch_size,), jnp.int32))


def split_cache_layers(cache: KVCache) -> KVCache:
    """The cache with k and v as tuples of per-layer arrays, for a decode loop to carry; the
    model then runs its layers unrolled. Each layer's attention reads its own buffer, where XLA's
    CPU backend copies a layer's slice of the stacked [L,...] array out before every product that
    reads it: for a decode step, the whole cache twice, on every token.

    The keys are stored transposed, [B,K,H,S], so that a query's scores are a plain product
    [G,H] x [H,S]; against [B,K,S,H] keys the CPU's dot library repacks every layer's keys on
    every token. The transpose rides on the copy out of the stacked array. Values stay
    [B,K,S,H]."""
    return cache.replace(k=tuple(jnp.swapaxes(k, -1, -2) for k in cache.k), v=tuple(cache.v))


def stack_cache_layers(cache: KVCache) -> KVCache:
    """The inverse of `split_cache_layers`."""
    return cache.replace(k=jnp.stack([jnp.swapaxes(k, -1, -2) for k in cache.k]),
                         v=jnp.stack(cache.v))


def split_param_layers(params: nnx.State) -> nnx.State:
    """Params whose stacked layer weights are tuples of per-layer arrays, sliced once (outside
    a decode loop) rather than on every step by the unrolled layers; it copies the layer
    weights once. Used with a `split_cache_layers` cache.

    In this form the MLP weights are stored [out, in]: `w_gate` holds the gate's rows and then
    the up projection's, [2F, D], `w_up` is empty, and `w_down` is [D, F]. For a decode step's
    few rows, XLA:CPU's dot library runs products against [out, in] weights faster than against
    [in, out] ones, and one product for gate and up faster than two (both sampler benchmark
    shapes, docs/benchmarks.md). The output projection `wo` is [D, N*H] likewise: kept [N,H,D],
    XLA:CPU copied it transposed to [H,N,D] on every decoded token, to match the layout it gave
    the attention's output."""
    out = nnx.State(dict(params))
    split = jax.tree.map(tuple, params["layers"])
    gate, up, down = (split[name].value for name in ("w_gate", "w_up", "w_down"))
    split["w_gate"].value = tuple(jnp.concatenate([g, u], axis=1).T for g, u in zip(gate, up))
    split["w_up"].value = tuple(jnp.zeros((0,), u.dtype) for u in up)
    split["w_down"].value = tuple(d.T for d in down)
    split["wo"].value = tuple(o.reshape(-1, o.shape[-1]).T for o in split["wo"].value)
    out["layers"] = split
    return out


CACHE_LOGICAL_AXES = KVCache(k=("layers", "batch", "kv_heads", "cache_seq", "head_dim"),
                             v=("layers", "batch", "kv_heads", "cache_seq", "head_dim"),
                             valid=("batch", "cache_seq"), end=("batch",))
# One layer's buffers in the form of `split_cache_layers` (keys transposed).
SPLIT_CACHE_LOGICAL_AXES = CACHE_LOGICAL_AXES.replace(k=("batch", "kv_heads", "head_dim", "cache_seq"),
                                                      v=CACHE_LOGICAL_AXES.v[1:])


def _layer_param_shapes(cfg: DecoderConfig) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """name -> (per-layer shape, logical axes without the leading "layers")."""
    d, f, n, k, h = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                     cfg.head_dim)
    shapes = {
        "input_norm": ((d,), ("norm",)),
        "wq": ((d, n, h), ("embed", "heads", "head_dim")),
        "wk": ((d, k, h), ("embed", "kv_heads", "head_dim")),
        "wv": ((d, k, h), ("embed", "kv_heads", "head_dim")),
        "wo": ((n, h, d), ("heads", "head_dim", "embed")),
        "post_attention_norm": ((d,), ("norm",)),
        "w_gate": ((d, f), ("embed", "mlp")),
        "w_up": ((d, f), ("embed", "mlp")),
        "w_down": ((f, d), ("mlp", "embed")),
    }
    if cfg.qkv_bias:
        shapes.update(bq=((n, h), ("heads", "head_dim")), bk=((k, h), ("kv_heads", "head_dim")),
                      bv=((k, h), ("kv_heads", "head_dim")))
    if cfg.o_bias:
        shapes["bo"] = ((d,), ("embed",))
    if cfg.qk_norm:
        shapes.update(q_norm=((h,), ("head_dim",)), k_norm=((h,), ("head_dim",)))
    return shapes


class DecoderLayers(nnx.Module):
    """All transformer blocks, each weight stacked over a leading layer axis."""

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        for name, (shape, axes) in _layer_param_shapes(cfg).items():
            full_shape = (cfg.num_layers, *shape)
            if name.endswith("norm"):
                value = jnp.ones(full_shape, cfg.weight_dtype)
            elif name.startswith("b"):
                value = jnp.zeros(full_shape, cfg.weight_dtype)
            else:
                value = layers.normal_init(rngs.params(), full_shape, cfg.weight_dtype)
            setattr(self, name, layers.param(value, ("layers", *axes)))


class Decoder(nnx.Module):
    """Decoder-only LM. Call: tokens [B,T] -> logits [B,T,V] (float32), see crl_jax/models/API.md."""

    def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs):
        self.config = cfg
        self.embed = layers.param(
            layers.normal_init(rngs.params(), (cfg.vocab_size, cfg.hidden_size), cfg.weight_dtype),
            ("vocab", "embed"))
        self.layers = DecoderLayers(cfg, rngs=rngs)
        self.final_norm = layers.param(jnp.ones((cfg.hidden_size,), cfg.weight_dtype), ("norm",))
        if not cfg.tie_embeddings:
            self.lm_head = layers.param(
                layers.normal_init(rngs.params(), (cfg.hidden_size, cfg.vocab_size), cfg.weight_dtype),
                ("embed", "vocab"))

    def __call__(self, tokens: jax.Array, positions: jax.Array | None = None,
                 attention_mask: jax.Array | None = None, cache: KVCache | None = None,
                 return_hidden: bool = False):
        cfg = self.config
        tokens = jnp.asarray(tokens, jnp.int32)
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [batch, time] int ids, got shape {tokens.shape}")
        batch, time = tokens.shape
        mask = (jnp.ones((batch, time), bool) if attention_mask is None
                else jnp.asarray(attention_mask).astype(bool))
        if mask.shape != tokens.shape:
            raise ValueError(f"attention_mask shape {mask.shape} != tokens shape {tokens.shape}")
        if positions is None:
            before = 0 if cache is None else jnp.sum(cache.valid, axis=1, keepdims=True)
            positions = jnp.maximum(before + jnp.cumsum(mask, axis=1) - 1, 0)
        positions = jnp.asarray(positions, jnp.int32)
        if positions.shape != tokens.shape:
            raise ValueError(f"positions shape {positions.shape} != tokens shape {tokens.shape}")

        if cache is None:
            # Slot s of the sequence is visible to query t when s <= t and s is not padding.
            key_valid, write_slots = mask, None
        else:
            if cache.valid.shape[0] != batch:
                raise ValueError(f"cache batch {cache.valid.shape[0]} != tokens batch {batch}")
            write_slots = cache.end[:, None] + jnp.arange(time)[None, :]  # [B,T]
            valid = cache.valid.at[jnp.arange(batch)[:, None], write_slots].set(mask, mode="drop")
            key_valid = valid  # query t sees the valid slots up to its own, write_slots[t]

        x = jnp.take(self.embed.value, tokens, axis=0).astype(cfg.compute_dtype)
        x, new_kv = _run_layers(cfg, self.layers, x, positions, key_valid, cache, write_slots)
        x = layers.rms_norm(x, self.final_norm.value, cfg.rms_norm_eps)
        if return_hidden:
            out = x
        else:
            head = self.embed.value.T if cfg.tie_embeddings else self.lm_head.value
            out = layers.dense("btd,dv->btv", x, head.astype(cfg.compute_dtype), cfg.dot_chunk,
                               preferred_element_type=jnp.float32)
        if cache is None:
            return out
        # A row advances past its last real token; an all-padding chunk leaves it where it was.
        last_real = jnp.max(jnp.where(mask, jnp.arange(time)[None, :] + 1, 0), axis=1)
        new_cache = KVCache(k=new_kv[0], v=new_kv[1], valid=valid, end=cache.end + last_real)
        return out, new_cache


def _unroll(cfg) -> int:
    """Scan unrolling for the no-cache path. Shallow models are unrolled: their compile time stays
    small, and XLA on CPU then skips the stacked-residual copies of the scan's backward pass
    (a 4-layer 1M-parameter update at [16, 768] goes from ~5.6 s to ~3.5 s). Deep models keep
    the rolled scan so compile time does not grow with depth."""
    return cfg.num_layers if cfg.num_layers <= 4 and cfg.remat == "none" else 1


def _split_along_time(x: jax.Array) -> jax.Array:
    """Context parallelism: the layer's input [B,T,D], which remat keeps, split along T over the
    mesh in context (a no-op without one)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    spec = sharding.logical_to_spec(("context_batch", "context", None), mesh, x.shape)
    return jax.lax.with_sharding_constraint(x, spec)


class _LayerMath:
    """One layer's computations around attention, for the scans of `_run_layers`."""

    def __init__(self, cfg, positions, cached: bool, out_in: bool = False):
        self.cfg, self.positions, self.cached = cfg, positions, cached
        self.out_in = out_in  # MLP and output weights in split_param_layers' [out, in] form
        self.inv_freq = layers.rope_inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.dtype, self.chunk = cfg.compute_dtype, cfg.dot_chunk

    def cast(self, w):
        return {name: value.astype(self.dtype) for name, value in w.items()}

    def project(self, x, w):
        """Pre-norm q, k, v of one layer: q [B,T,N,H], k/v [B,T,K,H]."""
        cfg, chunk = self.cfg, self.chunk
        h = layers.rms_norm(x, w["input_norm"], cfg.rms_norm_eps)
        q = layers.dense("btd,dnh->btnh", h, w["wq"], chunk)
        k = layers.dense("btd,dkh->btkh", h, w["wk"], chunk)
        v = layers.dense("btd,dkh->btkh", h, w["wv"], chunk)
        if cfg.qkv_bias:
            q, k, v = q + w["bq"], k + w["bk"], v + w["bv"]
        if cfg.qk_norm:
            q = layers.rms_norm(q, w["q_norm"], cfg.rms_norm_eps)
            k = layers.rms_norm(k, w["k_norm"], cfg.rms_norm_eps)
        return (layers.apply_rope(q, self.positions, self.inv_freq),
                layers.apply_rope(k, self.positions, self.inv_freq), v)

    def gate_and_up(self, h, w):
        """The MLP's two input projections [B,T,F]. Without a cache (training, scoring) they are
        one product with the weights stacked [D,2,F] (`layers.stacked_gate_and_up`, whose
        backward takes each half's products), and F keeps its sharding. With a cache
        (the sampler) each weight is read as it is: stacking would copy both on every token.
        Weights from `split_param_layers` come stacked already, [2F, D], and take one product.
        Otherwise chunked dots (a CPU parity mode) keep the two products too: their rounding is
        the point."""
        chunk = self.chunk
        if self.out_in:
            return tuple(jnp.split(layers.dense("btd,fd->btf", h, w["w_gate"], chunk), 2, axis=-1))
        if self.cached or chunk:
            return (layers.dense("btd,df->btf", h, w["w_gate"], chunk),
                    layers.dense("btd,df->btf", h, w["w_up"], chunk))
        return layers.stacked_gate_and_up(h, w["w_gate"], w["w_up"])

    def finish(self, x, w, attn):
        """Output projection, residual and SwiGLU MLP of one layer."""
        cfg, chunk = self.cfg, self.chunk
        if self.out_in:
            out = layers.dense("btf,df->btd", attn.reshape(attn.shape[:2] + (-1,)), w["wo"], chunk)
        else:
            out = layers.dense("btnh,nhd->btd", attn, w["wo"], chunk)
        if cfg.o_bias:
            out = out + w["bo"]
        x = x + out
        h = layers.rms_norm(x, w["post_attention_norm"], cfg.rms_norm_eps)
        return x + self.mlp(h, w)

    def mlp(self, h, w):
        """SwiGLU MLP [B,T,D]. With `mlp_chunk` (and no cache) it runs over time chunks of that
        many tokens, each rematerialised: the update then keeps each layer's MLP input [B,T,D]
        for the backward instead of its [B,T,F] activations, and builds one chunk's at a time.
        Once attention is blockwise those activations are most of a long sequence's memory."""
        size = self.cfg.mlp_chunk
        if self.cached or not size or h.shape[1] <= size:
            return self._swiglu(h, w)
        b, t, d = h.shape
        padded = layers.round_up(t, size)
        chunks = jnp.pad(h, ((0, 0), (0, padded - t), (0, 0))).reshape(b, padded // size, size, d)
        weights = {name: w[name] for name in ("w_gate", "w_up", "w_down")}
        out = jax.lax.map(jax.checkpoint(lambda part: self._swiglu(part, weights)),
                          chunks.swapaxes(0, 1))
        return out.swapaxes(0, 1).reshape(b, padded, d)[:, :t]

    def _swiglu(self, h, w):
        gate, up = self.gate_and_up(h, w)
        spec = "btf,df->btd" if self.out_in else "btf,fd->btd"
        return layers.dense(spec, layers.silu(gate) * up, w["w_down"], self.chunk)


def _run_layers(cfg, stacked: DecoderLayers, x, positions, key_valid, cache, write_slots):
    """Scan the transformer blocks. Returns the final hidden state and the updated (k, v) caches."""
    weights = {name: getattr(stacked, name).value for name in _layer_param_shapes(cfg)}
    # Per-layer caches (split_cache_layers) come with split_param_layers' weights.
    split = cache is not None and isinstance(cache.k, tuple)
    math = _LayerMath(cfg, positions, cached=cache is not None, out_in=split)
    dtype = cfg.compute_dtype

    if cache is None:
        def block(x, w):
            x = _split_along_time(x) if cfg.context_parallel else x
            w = math.cast(w)
            q, k, v = math.project(x, w)
            attn = attention.attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), key_valid,
                                       implementation=cfg.attention, block=cfg.attention_block,
                                       context_parallel=cfg.context_parallel)
            return math.finish(x, w, attn), None

        if cfg.remat != "none":
            block = jax.checkpoint(block, policy=_REMAT_POLICIES[cfg.remat])
        x, _ = jax.lax.scan(block, x, weights, unroll=_unroll(cfg))
        return x, None

    # The stacked caches travel in the scan carry and the new keys/values are scattered straight
    # into them at layer i (no slice-out and write-back of the layer's cache), so a decode step
    # moves only what attention reads.
    rows = jnp.arange(x.shape[0])[:, None]

    def block_cached(carry, w):
        x, k_all, v_all, i = carry
        w = math.cast(w)
        q, k, v = math.project(x, w)
        # Advanced indices (i, rows, write_slots) around the kv-head slice: the update is [B,T,K,H].
        k_all = k_all.at[i, rows, :, write_slots].set(k.astype(k_all.dtype), mode="drop")
        v_all = v_all.at[i, rows, :, write_slots].set(v.astype(v_all.dtype), mode="drop")
        attn = attention.attention(q, k_all[i].astype(dtype), v_all[i].astype(dtype), key_valid,
                                   write_slots, implementation=cfg.attention, block=cfg.attention_block)
        return (math.finish(x, w, attn), k_all, v_all, i + 1), None

    if split:  # one buffer per layer, layers unrolled
        ks, vs = list(cache.k), list(cache.v)
        for i in range(cfg.num_layers):
            w = math.cast({name: value[i] for name, value in weights.items()})
            q, k, v = math.project(x, w)
            # Keys [B,K,H,S]: (rows, write_slots) still index [B,T] and the update is [B,T,K,H].
            ks[i] = ks[i].at[rows, :, :, write_slots].set(k.astype(ks[i].dtype), mode="drop")
            vs[i] = vs[i].at[rows, :, write_slots].set(v.astype(vs[i].dtype), mode="drop")
            attn = attention.attention(q, ks[i].astype(dtype), vs[i].astype(dtype), key_valid, write_slots,
                                       implementation=cfg.attention, block=cfg.attention_block,
                                       keys_transposed=True)
            x = math.finish(x, w, attn)
        return x, (tuple(ks), tuple(vs))
    (x, k_all, v_all, _), _ = jax.lax.scan(block_cached, (x, cache.k, cache.v, 0), weights)
    return x, (k_all, v_all)


def apply(graphdef: nnx.GraphDef, params: nnx.State, tokens, positions=None, attention_mask=None,
          cache: KVCache | None = None, return_hidden: bool = False):
    """Functional forward for use inside jit: params are an argument, never closed over."""
    model = nnx.merge(graphdef, params)
    return model(tokens, positions=positions, attention_mask=attention_mask, cache=cache,
                 return_hidden=return_hidden)


def param_logical_axes(params: nnx.State):
    """The tree of logical-axis tuples matching `params` (as split from a crl_jax model)."""
    return jax.tree.map(lambda v: v.get_metadata().get("logical_axes"), params,
                        is_leaf=lambda x: isinstance(x, nnx.Variable))
