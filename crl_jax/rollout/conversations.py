"""The host side of generation: a batch of multi-turn conversations over one device state.

`Sampler` holds what is static (model structure, spec, mesh) and the compiled program.
`Conversations` keeps, per row, the exact token history that the model has seen (numpy/Python
lists; never re-tokenised text), how much of it is already in the KV cache, and where each turn
starts. Each `step` appends new tokens (the prompt on the first call, the environment's reply
later) to every active row and generates, without recomputing what is already cached.

History layout per row: segment 0 is the first prompt; segment k >= 1 is the k-th response
followed by whatever the environment appended after it. When a row would overflow the cache:
  - overflow="error": ValueError naming the row and the lengths involved;
  - overflow="drop_oldest": segments 1, 2, ... are dropped (oldest first, segment 0 and the newest
    segment always kept) until the row fits, and the row is re-prefilled from the kept history.
    `history(b)` then returns the kept context, and `dropped_tokens[b]` counts what was removed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from crl_jax import models, sharding
from crl_jax.sampling import engine, stops
from crl_jax.sampling.spec import SamplerSpec
from crl_jax.shapes import pow2_bucket


@dataclasses.dataclass
class TurnResult:
    """Host copies of one step's outputs. Per row b: tokens[b], logprobs[b] (raw-model
    log-softmax at temperature 1), processed_logprobs[b] (or None) and finish_reasons[b]."""

    tokens: list[np.ndarray]
    logprobs: list[np.ndarray]
    processed_logprobs: list[np.ndarray] | None
    finish_reasons: list[str]
    reprefilled_rows: list[int]


def shard_params(params: nnx.State, mesh: Mesh) -> nnx.State:
    """Place params on the mesh by their logical axes (heads/MLP/vocab over tensor)."""
    axes = models.param_logical_axes(params)
    return jax.tree.map(
        lambda v, a: v.replace(jax.device_put(v.value, sharding.logical_sharding(mesh, a, v.value.shape))),
        params, axes, is_leaf=lambda x: isinstance(x, nnx.Variable))


# A conversation's cache on a CPU starts at this many slots and doubles as its longest row needs
# (up to spec.cache_length): every decoded token reads every slot, and on a CPU that read is most
# of a small model's decode step. On accelerators the cache is whole from the start, since each
# capacity is one more compile of a large program there.
CPU_GROW_FROM = 256


class Sampler:
    """Static half of generation: one compiled program per (graphdef, spec, mesh, chunk bucket,
    cache capacity).

    grow_from: the first capacity of a conversation's cache, in slots; it doubles when a row needs
    more (`capacity_for`). None: the whole spec.cache_length from the start. "auto":
    `CPU_GROW_FROM` on a CPU, None elsewhere. Results depend on it through float rounding only
    (a softmax over more masked slots may sum in another order), which can flip a rare draw."""

    def __init__(self, graphdef: nnx.GraphDef, cfg: models.DecoderConfig, spec: SamplerSpec, *,
                 mesh: Mesh | None = None, cache_dtype=None, min_chunk: int = 8,
                 grow_from: int | str | None = "auto"):
        self.graphdef, self.cfg, self.spec, self.mesh = graphdef, cfg, spec, mesh
        self.cache_dtype = cache_dtype
        self.min_chunk = min_chunk
        if grow_from == "auto":
            grow_from = CPU_GROW_FROM if engine.on_cpu(mesh) else None
        if grow_from is not None and (not isinstance(grow_from, int) or grow_from < 1):
            raise ValueError(f"grow_from must be a positive slot count, None or 'auto'; got {grow_from!r}")
        self.grow_from = grow_from
        self._generate = engine.jitted_generate(graphdef, spec, mesh)

    def capacity_for(self, slots: int) -> int:
        """The cache capacity for rows needing up to `slots` slots: a power of two from
        `grow_from` on, at most spec.cache_length (the whole of it without growth)."""
        if self.grow_from is None:
            return self.spec.cache_length
        return min(self.spec.cache_length, pow2_bucket(slots, least=self.grow_from))

    def chunk_length(self, longest: int) -> int:
        """Chunks are padded to a power of two (>= min_chunk, <= cache length) so that the number
        of compiled programs stays logarithmic in the prompt lengths seen."""
        length = pow2_bucket(longest, least=self.min_chunk)
        return min(length, self.spec.cache_length)

    def new_conversations(self, batch_size: int, seed: int = 0, first_row: int = 0) -> Conversations:
        """`first_row`: the global index of row 0 (a host's slice of a larger batch)."""
        return Conversations(self, batch_size, seed, first_row)

    def generate(self, params: nnx.State, prompts: Sequence[Sequence[int]], seed: int = 0) -> TurnResult:
        """One-shot generation for a batch of prompts (token-id lists of any lengths)."""
        return self.new_conversations(len(prompts), seed).step(params, prompts)

    def _to_device(self, array: np.ndarray, axes) -> jax.Array:
        if self.mesh is None:
            return jnp.asarray(array)
        return jax.device_put(array, sharding.logical_sharding(self.mesh, axes, array.shape))


class Conversations:
    """A batch of conversations sharing one donated device state (see the module docstring)."""

    def __init__(self, sampler: Sampler, batch_size: int, seed: int = 0, first_row: int = 0):
        self.sampler = sampler
        self.batch_size = batch_size
        self.state = engine.init_state(sampler.cfg, batch_size, sampler.spec, seed,
                                       sampler.cache_dtype, sampler.mesh, first_row,
                                       capacity=sampler.capacity_for(0))
        self._history: list[list[int]] = [[] for _ in range(batch_size)]
        self._segments: list[list[int]] = [[] for _ in range(batch_size)]  # start index per segment
        self._cached = [0] * batch_size  # history tokens already written to the cache
        self.dropped_tokens = [0] * batch_size

    def history(self, row: int) -> list[int]:
        """The tokens row `row` is conditioned on now (including the last generated token)."""
        return list(self._history[row])

    def cached_length(self, row: int) -> int:
        return self._cached[row]

    def _fit(self, row: int, new: list[int]) -> bool:
        """Apply the overflow policy to `row` about to receive `new`; True if it must re-prefill."""
        spec = self.sampler.spec
        history, cached = self._history[row], self._cached[row]
        needed = len(history) + len(new) + spec.max_new_tokens - 1
        if needed <= spec.cache_length:
            return False
        detail = (f"row {row}: {cached} tokens cached + {len(history) - cached + len(new)} to append "
                  f"+ up to {spec.max_new_tokens - 1} generated = {needed} slots > cache_length "
                  f"{spec.cache_length}")
        if spec.overflow == "error":
            raise ValueError(f"KV cache overflow: {detail}. Use a larger cache_length, a smaller "
                             "max_new_tokens, or overflow='drop_oldest'.")
        starts = self._segments[row]
        total = len(history) + len(new)
        for first_kept in range(1, len(starts)):
            end_seg0 = starts[1]
            kept = end_seg0 + total - starts[first_kept]
            if kept + spec.max_new_tokens - 1 <= spec.cache_length:
                break
        else:
            raise ValueError(f"KV cache overflow: {detail}; even after dropping every turn but the "
                             "first prompt and the newest one it does not fit.")
        cut = starts[first_kept] - starts[1]
        self._history[row] = history[:starts[1]] + history[starts[first_kept]:]
        self._segments[row] = starts[:1] + [s - cut for s in starts[first_kept:]]
        self.dropped_tokens[row] += cut
        self._cached[row] = 0
        return True

    def _reserve(self, slots: int) -> None:
        """Widen the cache if a row of this call may need up to `slots` slots (`_fit` has kept
        every row within spec.cache_length)."""
        capacity = self.sampler.capacity_for(slots)
        if capacity > self.state.cache.max_len:
            self.state = engine.grow_state(self.state, capacity, self.sampler.mesh)

    def _admit(self, new_tokens, active: list[bool]) -> tuple[list[list[int]], list[bool]]:
        """Check each row's new tokens and make room for them in its cache: (new tokens per row,
        whether each row's cache was reset to be re-prefilled from its kept history)."""
        vocab = self.sampler.cfg.vocab_size
        news, reset = [], [False] * self.batch_size
        for b in range(self.batch_size):
            new = [int(t) for t in (new_tokens[b] or ())]
            if not active[b]:
                if new:
                    raise ValueError(f"row {b} is inactive but was given {len(new)} new tokens")
                news.append(new)
                continue
            bad = [t for t in new if not 0 <= t < vocab]
            if bad:
                raise ValueError(f"row {b}: token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
            if not self._history[b] and not new:
                raise ValueError(f"row {b} is active but has no tokens to condition on")
            if not self._history[b]:
                self._segments[b] = [0]
            reset[b] = self._fit(b, new)
            news.append(new)
        return news, reset

    def step(self, params: nnx.State, new_tokens: Sequence[Sequence[int] | None],
             active: Sequence[bool] | None = None) -> TurnResult:
        """Append new_tokens[b] to each active row (None or [] for nothing new) and generate."""
        sampler, batch = self.sampler, self.batch_size
        if len(new_tokens) != batch:
            raise ValueError(f"new_tokens has {len(new_tokens)} rows, the batch has {batch}")
        active = [True] * batch if active is None else [bool(a) for a in active]
        if len(active) != batch:
            raise ValueError(f"active has {len(active)} entries, the batch has {batch}")
        news, reset = self._admit(new_tokens, active)
        self._reserve(max((len(self._history[b]) + len(news[b]) + sampler.spec.max_new_tokens - 1
                           for b in range(batch) if active[b]), default=0))
        chunks = [self._history[b][self._cached[b]:] + news[b] if active[b] else [] for b in range(batch)]
        width = sampler.chunk_length(max(len(c) for c in chunks))
        tokens = np.zeros((batch, width), np.int32)
        mask = np.zeros((batch, width), bool)
        for b, chunk in enumerate(chunks):
            tokens[b, :len(chunk)] = chunk
            mask[b, :len(chunk)] = True
        batch_axes = ("batch",)
        self.state, out = sampler._generate(
            params, self.state, sampler._to_device(tokens, ("batch", None)),
            sampler._to_device(mask, ("batch", None)),
            sampler._to_device(np.asarray(active), batch_axes),
            sampler._to_device(np.asarray(reset), batch_axes))
        out, end = jax.device_get((out, self.state.cache.end))

        result = TurnResult([], [], [] if out.processed_logprobs is not None else None, [],
                            [b for b in range(batch) if reset[b]])
        for b in range(batch):
            n = int(out.lengths[b])
            generated = out.tokens[b, :n]
            result.tokens.append(generated)
            result.logprobs.append(out.logprobs[b, :n])
            if result.processed_logprobs is not None:
                result.processed_logprobs.append(out.processed_logprobs[b, :n])
            result.finish_reasons.append(stops.FINISH_REASONS[int(out.finish_reason[b])])
            if not active[b]:
                continue
            self._history[b].extend(news[b])
            self._segments[b].append(len(self._history[b]))
            self._history[b].extend(int(t) for t in generated)
            self._cached[b] = int(end[b])
            # Everything but the last generated token is in the cache now.
            if self._cached[b] != len(self._history[b]) - 1:
                raise RuntimeError(f"row {b}: cache holds {self._cached[b]} tokens but the history "
                                   f"has {len(self._history[b])}; the cache was modified elsewhere")
        return result
