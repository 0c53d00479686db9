"""The device side of generation: append a chunk to each row's KV cache, then decode in a loop.

`generate` is one jitted program per (graphdef, spec, chunk length): it writes a padded chunk of new
tokens (a prompt, or the environment's reply plus the token still pending from the previous call)
into the preallocated cache, samples the first token from the last real position of the chunk,
and then decodes one token per step inside `lax.while_loop` until every row is done or
`spec.max_new_tokens` tokens were produced. Weights are an argument (new weights never recompile);
the `SamplerState` (cache + random key) is donated, so the cache is updated in place.

The last token sampled in a call is returned but not yet written to the cache (writing it would
cost a forward pass whose logits nobody needs when the episode ends); the caller feeds it at the
start of the next chunk. Finished rows feed a padding token, which leaves their cache unchanged.

Legend: B batch, T chunk time, N max new tokens, S cache slots, D model, V vocab.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx, struct
from jax.sharding import Mesh

from crl_jax import models, sharding
from crl_jax.sampling import stops
from crl_jax.sampling.methods import choose_tokens
from crl_jax.sampling.spec import SamplerSpec

PAD_OUTPUT = -1  # token id written past a row's end in the output buffer


@struct.dataclass
class SamplerState:
    """What persists on device between calls: the KV cache, the random key, and each row's global
    index. A row's tokens are drawn with keys folded from its global index, so an episode samples
    the same tokens whether it runs in one batch or in a host's slice of it (multi-host rollouts)."""

    cache: models.KVCache
    rng: jax.Array
    rows: jax.Array  # [B] int32


@struct.dataclass
class SampleOutput:
    """One call's results. Row b produced tokens[b, :lengths[b]] (PAD_OUTPUT after).

    logprobs: log-softmax of the raw model logits (temperature 1) at each sampled token: the
      policy log-probability the RL losses need. processed_logprobs: under the processed
      distribution actually sampled from (None unless the spec asks for it).
    finish_reason: per row, one of stops.FINISH_REASONS.
    """

    tokens: jax.Array
    logprobs: jax.Array
    processed_logprobs: jax.Array | None
    lengths: jax.Array
    finish_reason: jax.Array


def init_state(cfg: models.DecoderConfig, batch_size: int, spec: SamplerSpec, seed: int | jax.Array = 0,
               cache_dtype=None, mesh: Mesh | None = None, first_row: int = 0,
               capacity: int | None = None) -> SamplerState:
    """An empty state; with a mesh, the cache is born sharded (batch over data, heads over tensor).
    Rows are numbered first_row, first_row + 1, ... (their global indices). The cache holds
    `capacity` slots (default: spec.cache_length); `grow_state` widens it later."""
    rng = jax.random.key(seed) if isinstance(seed, int) else seed
    slots = spec.cache_length if capacity is None else capacity
    make = _state_maker(cfg, batch_size, slots, cache_dtype, mesh)
    return make(rng, jnp.int32(first_row))


@functools.lru_cache(maxsize=None)
def _state_maker(cfg: models.DecoderConfig, batch_size: int, slots: int, cache_dtype,
                 mesh: Mesh | None):
    """init_state's builder for one shape, jitted once on a mesh: the seed and the first row are
    arguments, not constants, so a run's many conversations share one program."""
    def make(rng, first_row):
        return SamplerState(cache=models.init_cache(cfg, batch_size, slots, cache_dtype),
                            rng=rng, rows=jnp.arange(batch_size, dtype=jnp.int32) + first_row)

    if mesh is None:
        return make
    shapes = jax.eval_shape(make, jax.random.key(0), jnp.int32(0))
    return jax.jit(make, out_shardings=state_shardings(mesh, shapes))


def grow_state(state: SamplerState, capacity: int, mesh: Mesh | None = None) -> SamplerState:
    """The state with its cache widened to `capacity` slots, the new ones empty at the end. A
    decode step reads every slot of the cache, so a conversation's cache starts small and grows
    with its longest row (`Sampler.capacity_for`). What is cached stays the same; masked slots
    weigh exactly 0, so results change by float rounding at most."""
    if capacity < state.cache.max_len:
        raise ValueError(f"a cache cannot shrink: {state.cache.max_len} slots -> {capacity}")
    return _grow(capacity, mesh)(state)


@functools.lru_cache(maxsize=None)
def _grow(capacity: int, mesh: Mesh | None):
    def grow(state):
        cache = state.cache
        widen = lambda x, axis: jnp.pad(
            x, [(0, capacity - cache.max_len if a == axis else 0) for a in range(x.ndim)])
        cache = cache.replace(k=widen(cache.k, 3), v=widen(cache.v, 3), valid=widen(cache.valid, 1))
        return state.replace(cache=_constrain_cache(cache, mesh))
    return jax.jit(grow)  # no donation: the widened buffers cannot reuse the old ones


def state_shardings(mesh: Mesh, state: SamplerState) -> SamplerState:
    """NamedShardings for a (possibly abstract) state, from the cache's logical axes."""
    cache = sharding.tree_shardings(mesh, state.cache, models.CACHE_LOGICAL_AXES)
    return SamplerState(cache=cache, rng=sharding.logical_sharding(mesh, None),
                        rows=sharding.logical_sharding(mesh, ("batch",), state.rows.shape))


def _head_logits(graphdef: nnx.GraphDef, params: nnx.State, hidden: jax.Array) -> jax.Array:
    """Logits [B,V] float32 from final hidden states [B,D] (lm head or tied embedding)."""
    model = nnx.merge(graphdef, params)
    cfg = model.config
    head = model.embed.value.T if cfg.tie_embeddings else model.lm_head.value
    return jnp.einsum("bd,dv->bv", hidden, head.astype(hidden.dtype),
                      preferred_element_type=jnp.float32)


def generate(graphdef: nnx.GraphDef, params: nnx.State, state: SamplerState, tokens: jax.Array,
             mask: jax.Array, active: jax.Array, reset: jax.Array, *, spec: SamplerSpec,
             mesh: Mesh | None = None) -> tuple[SamplerState, SampleOutput]:
    """Append tokens [B,T] (mask [B,T]: real tokens) to each row, then generate.

    active [B] bool: rows that generate in this call; the others must have an all-padding chunk
    and keep their cache untouched. reset [B] bool: rows whose cache is emptied before the chunk
    is written (re-prefill after dropping old turns). The caller guarantees that each active row
    has at least one real token and that end + real length + max_new_tokens - 1 <= S.
    """
    cache = state.cache
    batch, slots = cache.valid.shape
    limit = spec.max_new_tokens
    mask = mask.astype(bool) & active[:, None]
    cache = cache.replace(valid=cache.valid & ~reset[:, None], end=jnp.where(reset, 0, cache.end))
    rng, call_rng = jax.random.split(state.rng)
    logits, cache = _prefill(graphdef, params, tokens, mask, cache, mesh)
    out_tokens = jnp.full((batch, limit), PAD_OUTPUT, jnp.int32)
    out_logprobs = jnp.zeros((batch, limit), jnp.float32)
    out_processed = jnp.zeros((batch, limit), jnp.float32) if spec.return_processed_logprobs else None
    reason = jnp.where(active, stops.RUNNING, stops.INACTIVE).astype(jnp.int32)
    window = stops.empty_window(batch, spec)
    record = functools.partial(_record, spec, call_rng, state.rows)
    done = ~active
    token, done, reason, window, out_tokens, out_logprobs, out_processed = record(
        0, logits, done, reason, window, out_tokens, out_logprobs, out_processed)
    lengths = active.astype(jnp.int32)
    per_layer = _decode_per_layer(mesh)
    decode_params, cache = ((models.split_param_layers(params), models.split_cache_layers(cache))
                            if per_layer else (params, cache))

    def cond(carry):
        step, _, done = carry[:3]
        return (step < limit) & ~jnp.all(done)

    def body(carry):
        step, token, done, reason, window, lengths, cache, out_tokens, out_logprobs, out_processed = carry
        # A row whose cache is full cannot take its pending token: it stops here.
        full = ~done & (cache.end >= slots)
        reason = jnp.where(full, stops.CACHE_FULL, reason)
        done = done | full
        feed = jnp.where(done, 0, token)[:, None]
        logits, cache = models.apply(graphdef, decode_params, feed, attention_mask=~done[:, None],
                                     cache=cache)
        cache = _constrain_cache(cache, mesh)
        lengths = lengths + (~done).astype(jnp.int32)  # rows still running before this token
        token, done, reason, window, out_tokens, out_logprobs, out_processed = record(
            step, logits[:, 0], done, reason, window, out_tokens, out_logprobs, out_processed)
        return (step + 1, token, done, reason, window, lengths, cache, out_tokens, out_logprobs,
                out_processed)

    carry = (jnp.int32(1), token, done, reason, window, lengths, cache, out_tokens, out_logprobs,
             out_processed)
    carry = jax.lax.while_loop(cond, body, carry)
    _, _, done, reason, _, lengths, cache, out_tokens, out_logprobs, out_processed = carry
    cache = _constrain_cache(models.stack_cache_layers(cache), mesh) if per_layer else cache
    reason = jnp.where(done, reason, stops.MAX_TOKENS)
    output = SampleOutput(tokens=out_tokens, logprobs=out_logprobs,
                          processed_logprobs=out_processed, lengths=lengths, finish_reason=reason)
    return SamplerState(cache=cache, rng=rng, rows=state.rows), output


def _decode_per_layer(mesh: Mesh | None) -> bool:
    """Whether the decode loop runs on per-layer caches and weights (models.split_cache_layers):
    on a CPU, whose XLA backend otherwise copies each layer's keys, values and weights out of
    their stacked arrays on every decoded token. Elsewhere the layers stay scanned: the per-layer
    copy of the weights would double their memory, and the unrolled layers' compile time grows
    with depth."""
    return on_cpu(mesh)


def on_cpu(mesh: Mesh | None) -> bool:
    """Whether generation runs on CPU devices: the mesh's, or the default backend's."""
    platform = mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()
    return platform == "cpu"


def _constrain_cache(cache, mesh: Mesh | None):
    """The cache's sharding, stacked or split into layers (models.split_cache_layers)."""
    if isinstance(cache.k, tuple):  # each layer's buffer takes one layer's axes
        axes = models.SPLIT_CACHE_LOGICAL_AXES
        axes = axes.replace(k=(axes.k,) * len(cache.k), v=(axes.v,) * len(cache.v))
    else:
        axes = models.CACHE_LOGICAL_AXES
    # The cache's leaves are arrays, so each one meets its whole tuple of axis names.
    return jax.tree.map(lambda x, a: sharding.constrain(x, mesh, a), cache, axes)


def _prefill(graphdef, params, tokens, mask, cache, mesh: Mesh | None):
    """Write the chunk into the cache; (logits at each row's last real position, cache). Only
    those positions need logits, so only they are projected."""
    hidden, cache = models.apply(graphdef, params, tokens, attention_mask=mask, cache=cache,
                                 return_hidden=True)
    cache = _constrain_cache(cache, mesh)
    last = jnp.max(jnp.where(mask, jnp.arange(tokens.shape[1])[None, :], 0), axis=1)
    last_hidden = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
    return _head_logits(graphdef, params, last_hidden), cache


def _record(spec: SamplerSpec, call_rng, rows, step, logits, done, reason, window, out_tokens, out_logprobs,
            out_processed):
    """Sample a token for every row; rows already done keep their outputs and state."""
    token, logprob, processed = _choose_per_row(jax.random.fold_in(call_rng, step), rows, logits, spec)
    token = jnp.where(done, PAD_OUTPUT, token)
    out_tokens = jax.lax.dynamic_update_index_in_dim(out_tokens, token, step, axis=1)
    out_logprobs = jax.lax.dynamic_update_index_in_dim(
        out_logprobs, jnp.where(done, 0.0, logprob), step, axis=1)
    if out_processed is not None:
        out_processed = jax.lax.dynamic_update_index_in_dim(
            out_processed, jnp.where(done, 0.0, processed), step, axis=1)
    new_window, matched = stops.push_and_match(window, token, spec)
    window = jnp.where(done[:, None], window, new_window)
    hit_eos = stops.is_eos(token, spec) & ~done
    hit_stop = matched & ~done & ~hit_eos
    reason = jnp.where(hit_eos, stops.EOS, jnp.where(hit_stop, stops.STOP_SEQUENCE, reason))
    done = done | hit_eos | hit_stop
    return token, done, reason, window, out_tokens, out_logprobs, out_processed


def _choose_per_row(step_rng: jax.Array, rows: jax.Array, logits: jax.Array, spec: SamplerSpec):
    """`choose_tokens` with one key per row, folded from the row's global index [B]."""
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(step_rng, rows)
    token, logprob, processed = jax.vmap(lambda k, x: choose_tokens(k, x[None], spec))(keys, logits)
    return token[:, 0], logprob[:, 0], processed[:, 0]


@functools.lru_cache(maxsize=None)
def jitted_generate(graphdef: nnx.GraphDef, spec: SamplerSpec, mesh: Mesh | None = None):
    """`generate` compiled for one model structure and spec; the state argument is donated.
    (Cached so every caller with the same graphdef/spec/mesh shares one compile cache.)"""
    # The overflow policy is applied on the host; it must not cause a second compile.
    return _jitted(graphdef, spec.replace(overflow="error"), mesh)


@functools.lru_cache(maxsize=None)
def _jitted(graphdef, spec, mesh):
    fn = functools.partial(generate, graphdef, spec=spec, mesh=mesh)
    return jax.jit(fn, donate_argnums=(1,))
