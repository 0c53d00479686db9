"""The device-side training batch: padded token sequences plus what the advantages are made from.

`PolicyBatch` serves both models. For the actor, `rewards`, `group_ids` and `guided` feed the
subgroup GRPO advantages (computed inside the train step, over the whole batch); for the extractor,
`rewards` (mean +-1 outcome per generation) and `weights` (training-count weights) feed the CISPO
advantages. `TrainBatch` pairs an actor batch with an optional extractor batch; a batch without an
extractor part is a different pytree structure, hence its own compiled variant of the train step.

Legend: B batch (sequences), T time (tokens).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh

from crl_jax import sharding


@struct.dataclass
class PolicyBatch:
    tokens: jax.Array          # [B,T] int32: exact sampled / environment token ids, padded
    positions: jax.Array       # [B,T] int32 RoPE positions
    attention_mask: jax.Array  # [B,T] bool: real tokens
    loss_mask: jax.Array       # [B,T] float32: 1 on the trained model's own generated tokens
    old_logprobs: jax.Array    # [B,T] float32: sampler log-probs of each token (0 where unknown)
    rewards: jax.Array         # [B] float32
    group_ids: jax.Array       # [B] int32: task group (actor); unused for the extractor
    guided: jax.Array          # [B] bool: experience-guided rollout (actor)
    weights: jax.Array         # [B] float32: advantage weights (extractor: Eq.7; actor: 1)
    valid: jax.Array           # [B] bool: real rows (False rows are padding)
    ref_logprobs: jax.Array | None = None  # [B,T] float32, only with a KL penalty

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.tokens.shape)


@struct.dataclass
class TrainBatch:
    actor: PolicyBatch
    extractor: PolicyBatch | None = None


def make_policy_batch(tokens, loss_mask, rewards, *, attention_mask=None, positions=None,
                      old_logprobs=None, group_ids=None, guided=None, weights=None, valid=None,
                      ref_logprobs=None) -> PolicyBatch:
    """Host-side constructor from numpy arrays: fills defaults and checks shapes, one line each."""
    tokens = np.asarray(tokens, np.int32)
    problems = []
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [B, T], got shape {tokens.shape}")
    b, t = tokens.shape
    attention_mask = np.ones((b, t), bool) if attention_mask is None else np.asarray(
        attention_mask, bool)
    if positions is None:
        positions = np.maximum(np.cumsum(attention_mask, axis=1) - 1, 0)
    fields: dict[str, Any] = dict(
        tokens=tokens, positions=np.asarray(positions, np.int32), attention_mask=attention_mask,
        loss_mask=np.asarray(loss_mask, np.float32),
        old_logprobs=np.zeros((b, t), np.float32) if old_logprobs is None else np.asarray(
            old_logprobs, np.float32),
        rewards=np.asarray(rewards, np.float32),
        group_ids=np.zeros(b, np.int32) if group_ids is None else np.asarray(group_ids, np.int32),
        guided=np.zeros(b, bool) if guided is None else np.asarray(guided, bool),
        weights=np.ones(b, np.float32) if weights is None else np.asarray(weights, np.float32),
        valid=np.ones(b, bool) if valid is None else np.asarray(valid, bool),
        ref_logprobs=None if ref_logprobs is None else np.asarray(ref_logprobs, np.float32))
    for name, value in fields.items():
        if value is None:
            continue
        want = (b, t) if name in ("tokens", "positions", "attention_mask", "loss_mask", "old_logprobs",
                                  "ref_logprobs") else (b,)
        if value.shape != want:
            problems.append(f"{name} must have shape {want}, got {value.shape}")
    if problems:
        raise ValueError("invalid PolicyBatch:\n  " + "\n  ".join(problems))
    if (fields["loss_mask"][:, 0] != 0).any():
        raise ValueError("loss_mask[:, 0] must be 0: the first token has no prediction to train")
    return PolicyBatch(**fields)


def batch_logical_axes(batch):
    """Logical axes of every batch leaf: rows on "batch", tokens on "seq"."""
    return jax.tree.map(lambda x: ("batch", "seq")[:np.ndim(x)], batch)


def batch_shardings(mesh: Mesh, batch, context_parallel: bool = False):
    """Rows over the batch axes; with context parallelism, tokens over the context axis."""
    axes = ("context_batch", "context") if context_parallel else ("batch", "seq")
    return jax.tree.map(lambda x: sharding.logical_sharding(mesh, axes[:np.ndim(x)], np.shape(x)),
                        batch)


def split_micro_batches(batch: PolicyBatch, n: int) -> PolicyBatch:
    """[B, ...] -> [n, B/n, ...], micro-batch k holding rows k, k+n, k+2n, ...

    Interleaving rather than contiguous blocks keeps every micro-batch spread over all devices
    that hold a slice of the batch axis, so no row moves between devices.
    """
    b = batch.tokens.shape[0]
    if b % n:
        raise ValueError(f"batch size {b} is not divisible into {n} micro-batches")
    return jax.tree.map(lambda x: jnp.swapaxes(x.reshape(b // n, n, *x.shape[1:]), 0, 1), batch)
