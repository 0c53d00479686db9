"""Advantage estimators of Complementary RL: subgroup GRPO for the actor, the extractor's centred reward.

Actor (paper Eq.5): every task group of K rollouts is split into an experience-guided and an
experience-free subgroup, and rewards are normalised *inside each subgroup*. The normalisation is
either the paper's `(r - mean) / (std + eps)` ("mean_std") or the released code's `r - mean` ("mean").
The paper's two failure modes are kept as ablations: `split="group"` normalises over the whole task
group (no split), `split="batch"` normalises over the whole batch (cross-group).

Extractor (paper Eq.3): the advantage of a generation is its reward minus the batch mean, times
its training-count weight. The reward (the mean +-1 outcome of the episodes that used it) lives in
crl_jax/rollout/reward_buffer.py and the weight (Eq.7) in crl_jax/memory/bank.py: one home each.

Everything is pure jnp (usable inside jit) and also accepts numpy arrays on the host.

Legend: B batch (rollouts or extractor generations), P episodes.
"""

from __future__ import annotations

import jax.numpy as jnp

NORMALIZATIONS = ("mean_std", "mean")
SPLITS = ("subgroup", "group", "batch")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def group_advantages(rewards, group_ids, guided, valid=None, *, normalization: str = "mean_std",
                     split: str = "subgroup", eps: float = 1e-6):
    """Per-rollout advantages [B] from rewards [B], task-group ids [B] and guided flags [B].

    `valid` [B] (optional) marks real rows; padding rows get advantage 0 and do not enter any
    statistic. The standard deviation is the population one (ddof=0), so a subgroup of one rollout
    is well defined (advantage 0).
    """
    _check_choice("normalization", normalization, NORMALIZATIONS)
    _check_choice("split", split, SPLITS)
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {rewards.shape}")
    group_ids = jnp.asarray(group_ids)
    guided = jnp.asarray(guided, bool)
    if group_ids.shape != rewards.shape or guided.shape != rewards.shape:
        raise ValueError(f"rewards {rewards.shape}, group_ids {group_ids.shape} and guided "
                         f"{guided.shape} must all have shape [B]")
    valid = jnp.ones(rewards.shape, bool) if valid is None else jnp.asarray(valid, bool)

    # Membership as a [B, B] matrix instead of segment ops: group ids stay arbitrary integers
    # (no static segment count under jit), and B is a rollout batch (hundreds), so B^2 is tiny.
    if split == "batch":
        same = jnp.ones((rewards.shape[0],) * 2, bool)
    else:
        same = group_ids[:, None] == group_ids[None, :]
        if split == "subgroup":
            same &= guided[:, None] == guided[None, :]
    same &= valid[None, :]
    weights = same.astype(jnp.float32)
    count = jnp.maximum(weights.sum(axis=1), 1.0)
    mean = weights @ rewards / count
    centred = rewards - mean
    if normalization == "mean_std":
        var = (weights * (rewards[None, :] - mean[:, None]) ** 2).sum(axis=1) / count
        centred = centred / (jnp.sqrt(var) + eps)
    return jnp.where(valid, centred, 0.0)


def extractor_advantages(rewards, weights=None, valid=None):
    """CISPO advantages [B]: (reward - batch mean over valid rows) * weight; padding rows get 0."""
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {rewards.shape}")
    valid = jnp.ones(rewards.shape, bool) if valid is None else jnp.asarray(valid, bool)
    weights = jnp.ones(rewards.shape, jnp.float32) if weights is None else jnp.asarray(
        weights, jnp.float32)
    n = jnp.maximum(valid.sum(), 1)
    mean = jnp.where(valid, rewards, 0.0).sum() / n
    return jnp.where(valid, (rewards - mean) * weights, 0.0)
