"""The sampler's static configuration: one frozen, hashable `SamplerSpec`.

The spec is a `jax.jit` static argument, so everything in it is a Python scalar or a tuple: two
specs that compare equal share one compiled program. Things that change every call (weights, the
cache, prompts, random keys) are array arguments instead and never cause a recompile.

Validation happens in `__post_init__`, before any compute, with one clear line per problem.
"""

from __future__ import annotations

import dataclasses

METHODS = ("greedy", "sample")
OVERFLOW_POLICIES = ("error", "drop_oldest")


@dataclasses.dataclass(frozen=True)
class SamplerSpec:
    """How to sample.

    method: "greedy" (argmax of the raw logits) or "sample" (temperature, then top-k, then top-p,
      in that order, as in `transformers`' default warper order).
    temperature: > 0; only used by "sample".
    top_k: keep the k most likely tokens; 0 disables.
    top_p: keep the smallest set of most likely tokens whose probability reaches top_p (at least
      one token); 1.0 disables.
    max_new_tokens: tokens generated per call at most (the output buffer length).
    eos_ids: token ids that end a row's turn (the EOS token is emitted, then the row stops).
    stop_sequences: token-id sequences that end a row's turn once generated in full (emitted).
      They match on the ids only: a string that the tokenizer can split in several ways needs one
      entry per splitting.
    cache_length: KV-cache slots per row (prompt + every turn + generated tokens).
    overflow: what a continuation does when a row would not fit in the cache: "error" raises a
      message naming the row; "drop_oldest" drops the oldest turns after the first segment (the
      system/task prompt) and re-prefills the row.
    return_processed_logprobs: also return the log-probability of each sampled token under the
      processed distribution it was drawn from (temperature/top-k/top-p applied).
    """

    method: str = "greedy"
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 128
    eos_ids: tuple[int, ...] = ()
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    cache_length: int = 1024
    overflow: str = "error"
    return_processed_logprobs: bool = False

    def __post_init__(self):
        # Lists are accepted for convenience and frozen to tuples so the spec stays hashable.
        object.__setattr__(self, "eos_ids", tuple(int(t) for t in self.eos_ids))
        object.__setattr__(self, "stop_sequences",
                           tuple(tuple(int(t) for t in seq) for seq in self.stop_sequences))
        problems = []
        if self.method not in METHODS:
            problems.append(f"method must be one of {METHODS}, got {self.method!r}")
        if not self.temperature > 0:
            problems.append(f"temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            problems.append(f"top_k must be >= 0 (0 disables), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            problems.append(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.cache_length < 2:
            problems.append(f"cache_length must be >= 2, got {self.cache_length}")
        elif self.max_new_tokens >= self.cache_length:
            problems.append(f"max_new_tokens ({self.max_new_tokens}) must be smaller than "
                            f"cache_length ({self.cache_length}) to leave room for a prompt")
        if self.overflow not in OVERFLOW_POLICIES:
            problems.append(f"overflow must be one of {OVERFLOW_POLICIES}, got {self.overflow!r}")
        if any(t < 0 for t in self.eos_ids):
            problems.append(f"eos_ids must be non-negative token ids, got {self.eos_ids}")
        for seq in self.stop_sequences:
            if not seq:
                problems.append("stop_sequences must not contain an empty sequence")
            elif any(t < 0 for t in seq):
                problems.append(f"stop sequence {seq} contains a negative token id")
        if problems:
            raise ValueError("invalid SamplerSpec: " + "; ".join(problems))

    @property
    def max_stop_length(self) -> int:
        return max((len(s) for s in self.stop_sequences), default=0)

    def replace(self, **changes) -> SamplerSpec:
        return dataclasses.replace(self, **changes)


# The paper's actor setting (temperature 0.99, top-p 0.99, top-k 100).
PAPER_ACTOR = dict(method="sample", temperature=0.99, top_p=0.99, top_k=100)
# The paper's extractor setting (temperature 1.0, top-p 0.99, no top-k).
PAPER_EXTRACTOR = dict(method="sample", temperature=1.0, top_p=0.99, top_k=0)
