"""Host-side records of rollouts: what an episode was asked to be and what happened.

A `Trajectory` holds the exact token ids the actor was conditioned on and produced (never
re-tokenised text), a mask of the actor's own sampled tokens, the sampler's log-probs of those
tokens, and the bookkeeping the method needs (subgroup, injected entry, extractor generations used).
`to_policy_batch` pads a list of them into the actor's training batch.

Legend: B episodes, T tokens.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from crl_jax.memory.text_store import Generation
from crl_jax.rl.batch import PolicyBatch, make_policy_batch


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
    task: str
    seed: int
    group_id: int
    guided: bool


def group_specs(tasks: list[dict], group_size: int, guided_from: int) -> list[EpisodeSpec]:
    """A step's episodes: `group_size` per task (one GRPO group, one seed), those from index
    `guided_from` on experience-guided."""
    return [EpisodeSpec(task["env"], int(task["seed"]), group, k >= guided_from)
            for group, task in enumerate(tasks) for k in range(group_size)]


@dataclasses.dataclass
class Trajectory:
    spec: EpisodeSpec
    tokens: list[int] = dataclasses.field(default_factory=list)
    loss_mask: list[float] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    messages: list[dict] = dataclasses.field(default_factory=list)  # the transcript, as text
    # The environment's answer to the last action: never shown to the actor (the episode is
    # over), but part of what the extractor reads (prompts.distill_transcript).
    final_observation: str = ""
    goal: str = ""
    query: str = ""                      # retrieval key: goal + first observation
    entry_id: int | None = None          # the entry injected into the system prompt
    refinements: list[Generation] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    success: bool = False
    actions: int = 0                     # environment steps taken
    tool_calls: int = 0
    invalid_actions: int = 0
    end_reason: str = ""

    def append(self, ids, trained: bool, logprobs=None) -> None:
        ids = [int(t) for t in ids]
        self.tokens += ids
        self.loss_mask += [1.0 if trained else 0.0] * len(ids)
        self.logprobs += [float(x) for x in logprobs] if logprobs is not None else [0.0] * len(ids)


def _pad_rows(rows, length, dtype, fill=0):
    out = np.full((len(rows), length), fill, dtype)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row[:length]
    return out


def to_policy_batch(trajectories: list[Trajectory], max_len: int, rewards=None) -> PolicyBatch:
    """The actor's training batch: right-padded to `max_len` (longer episodes are cut, and their
    cut tokens are not trained)."""
    rewards = [t.reward for t in trajectories] if rewards is None else rewards
    tokens = _pad_rows([t.tokens for t in trajectories], max_len, np.int32)
    mask = _pad_rows([[1] * len(t.tokens) for t in trajectories], max_len, bool, False)
    loss = _pad_rows([t.loss_mask for t in trajectories], max_len, np.float32)
    loss[:, 0] = 0.0
    logprobs = _pad_rows([t.logprobs for t in trajectories], max_len, np.float32)
    return make_policy_batch(
        tokens, loss, np.asarray(rewards, np.float32), attention_mask=mask, old_logprobs=logprobs,
        group_ids=np.asarray([t.spec.group_id for t in trajectories], np.int32),
        guided=np.asarray([t.spec.guided for t in trajectories], bool))


def generations_batch(samples: list[tuple[Generation, float, float]], max_len: int, batch_size: int,
                      pad_id: int = 0) -> PolicyBatch:
    """The extractor's training batch from (generation, mean reward, weight) triples; padded to
    `batch_size` rows (padding rows are invalid) and `max_len` tokens (prompts cut from the left,
    so the response is always kept)."""
    rows, loss, logprobs = [], [], []
    for gen, _, _ in samples:
        prompt, response = list(gen.prompt_ids), list(gen.response_ids)
        keep_prompt = max(1, max_len - len(response))
        prompt = prompt[-keep_prompt:]
        response = response[:max_len - len(prompt)]
        rows.append(prompt + response)
        loss.append([0.0] * len(prompt) + [1.0] * len(response))
        lp = list(gen.response_logprobs or [0.0] * len(gen.response_ids))[:len(response)]
        logprobs.append([0.0] * len(prompt) + lp)
    n = len(samples)
    pad = batch_size - n
    if pad < 0:
        raise ValueError(f"{n} extractor samples exceed the batch size {batch_size}")
    rows += [[pad_id]] * pad
    loss += [[0.0]] * pad
    logprobs += [[0.0]] * pad
    tokens = _pad_rows(rows, max_len, np.int32, pad_id)
    mask = _pad_rows([[1] * len(r) for r in rows], max_len, bool, False)
    rewards = np.asarray([r for _, r, _ in samples] + [0.0] * pad, np.float32)
    weights = np.asarray([w for _, _, w in samples] + [0.0] * pad, np.float32)
    valid = np.arange(batch_size) < n
    return make_policy_batch(tokens, _pad_rows(loss, max_len, np.float32), rewards,
                             attention_mask=mask, old_logprobs=_pad_rows(logprobs, max_len, np.float32),
                             weights=weights, valid=valid)
