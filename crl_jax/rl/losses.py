"""Policy-gradient losses of Complementary RL: PPO-clip for the actor, CISPO for the extractor.

Token conventions: `logprobs[b, t]` is log pi(tokens[b, t] | tokens[b, <t]) (position 0 has no
prediction and must be masked); `loss_mask[b, t]` is 1 exactly on the tokens the trained model itself
generated (environment text, prompts and injected experience are 0). Advantages are per sequence [B]
or per token [B, T].

Aggregation is global over the whole optimiser batch: callers that split a batch into micro-batches
pass the whole batch's `num_tokens` / `num_seqs`, so the sum of the micro-batch losses (and
gradients) equals the loss of the unsplit batch exactly. Metrics follow the same rule: each is a
token mean with the global token count, so micro-batch metrics add up.

Losses are to be *minimised* (the negated objectives of paper Eq.3 and Eq.5).

Legend: B batch, T time, V vocab.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

AGGREGATIONS = ("seq_mean_token_mean", "token_mean")


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """One model's policy loss. `kl_coef` > 0 adds a k3 KL penalty to reference log-probs."""
    name: str = "ppo"
    eps_low: float = 0.2
    eps_high: float = 0.2
    aggregation: str = "seq_mean_token_mean"
    kl_coef: float = 0.0

    def problems(self) -> list[str]:
        out = []
        if self.name not in POLICY_LOSSES:
            out.append(f"loss name must be one of {sorted(POLICY_LOSSES)}, got {self.name!r}")
        if not 0.0 <= self.eps_low < 1.0:
            out.append(f"eps_low must be in [0, 1), got {self.eps_low}")
        if self.eps_high < 0.0:
            out.append(f"eps_high must be >= 0, got {self.eps_high}")
        if self.aggregation not in AGGREGATIONS:
            out.append(f"aggregation must be one of {AGGREGATIONS}, got {self.aggregation!r}")
        if self.kl_coef < 0.0:
            out.append(f"kl_coef must be >= 0, got {self.kl_coef}")
        return out


def token_logprobs(logits, tokens):
    """[B, T, V] logits, [B, T] tokens -> [B, T] log-probs of each token given its prefix (0 at t=0).

    Computed in float32 whatever the logits' dtype: the PPO ratio is exp of a difference of these.
    """
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None].astype(jnp.int32), axis=-1)[..., 0]
    return jnp.pad(picked, ((0, 0), (1, 0)))


def token_entropy(logits):
    """[B, T, V] -> [B, T] entropy of the next-token distribution, shifted like `token_logprobs`."""
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    ent = -(jnp.exp(logp) * logp).sum(-1)
    return jnp.pad(ent, ((0, 0), (1, 0)))


def batch_normalizers(loss_mask):
    """(num_tokens, num_seqs) of a whole batch: response tokens, sequences with >= 1 of them."""
    mask = jnp.asarray(loss_mask, jnp.float32)
    return mask.sum(), (mask.sum(-1) > 0).sum().astype(jnp.float32)


def aggregate(values, loss_mask, aggregation: str, *, num_tokens=None, num_seqs=None):
    """Reduce per-token values [B, T] over the mask to a scalar, by `aggregation`.

    token_mean: sum over all masked tokens / num_tokens.
    seq_mean_token_mean: per-sequence token mean, summed over sequences / num_seqs.
    """
    mask = jnp.asarray(loss_mask, jnp.float32)
    default_tokens, default_seqs = batch_normalizers(mask)
    num_tokens = default_tokens if num_tokens is None else num_tokens
    num_seqs = default_seqs if num_seqs is None else num_seqs
    if aggregation == "token_mean":
        return (values * mask).sum() / jnp.maximum(num_tokens, 1.0)
    if aggregation == "seq_mean_token_mean":
        per_seq = (values * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1.0)
        return per_seq.sum() / jnp.maximum(num_seqs, 1.0)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")


def _per_token(advantages, shape):
    advantages = jnp.asarray(advantages, jnp.float32)
    return advantages[:, None] * jnp.ones(shape, jnp.float32) if advantages.ndim == 1 else advantages


def _common_metrics(ratio, log_ratio, mask, num_tokens, eps_low, eps_high):
    mean = lambda v: aggregate(v, mask, "token_mean", num_tokens=num_tokens)  # noqa: E731
    return {
        # k3 estimate of KL(old || new): non-negative, low variance.
        "approx_kl": mean(ratio - 1.0 - log_ratio),
        "clip_frac_low": mean((ratio < 1.0 - eps_low).astype(jnp.float32)),
        "clip_frac_high": mean((ratio > 1.0 + eps_high).astype(jnp.float32)),
        "ratio_mean": mean(ratio),
    }


def _kl_penalty(logprobs, ref_logprobs, mask, cfg, num_tokens, num_seqs):
    # k3 estimator of KL(pi || ref) per token: exp(ref - logp) - (ref - logp) - 1 >= 0.
    d = ref_logprobs - logprobs
    kl = jnp.exp(d) - d - 1.0
    return aggregate(kl, mask, cfg.aggregation, num_tokens=num_tokens, num_seqs=num_seqs), kl


def ppo_loss(logprobs, old_logprobs, advantages, loss_mask, *, cfg: LossConfig,
             ref_logprobs=None, num_tokens=None, num_seqs=None):
    """Token-level PPO-clip: -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A), aggregated."""
    mask = jnp.asarray(loss_mask, jnp.float32)
    if num_tokens is None or num_seqs is None:
        num_tokens, num_seqs = batch_normalizers(mask)
    adv = _per_token(advantages, logprobs.shape)
    # Masked positions may hold garbage (padding); zero the difference so exp cannot overflow.
    log_ratio = jnp.where(mask > 0, logprobs - old_logprobs, 0.0)
    ratio = jnp.exp(log_ratio)
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high) * adv
    per_token = -jnp.minimum(unclipped, clipped)
    loss = aggregate(per_token, mask, cfg.aggregation, num_tokens=num_tokens, num_seqs=num_seqs)
    metrics = _common_metrics(ratio, log_ratio, mask, num_tokens, cfg.eps_low, cfg.eps_high)
    # Fraction of tokens whose gradient the clip removed (the clipped branch strictly won the min).
    metrics["clip_frac"] = aggregate((clipped < unclipped).astype(jnp.float32), mask, "token_mean",
                                     num_tokens=num_tokens)
    metrics["pg_loss"] = loss
    if cfg.kl_coef > 0.0 and ref_logprobs is not None:
        kl_loss, _ = _kl_penalty(logprobs, ref_logprobs, mask, cfg, num_tokens, num_seqs)
        metrics["kl_ref"] = kl_loss
        loss = loss + cfg.kl_coef * kl_loss
    return loss, metrics


def cispo_loss(logprobs, old_logprobs, advantages, loss_mask, *, cfg: LossConfig,
               ref_logprobs=None, num_tokens=None, num_seqs=None):
    """CISPO (paper Eq.3): -sg(clip(rho, 1 - eps_low, 1 + eps_high)) * A * log pi, summed over
    response tokens and divided by the batch's total response tokens (always token_mean: that is
    how Eq.3 normalises). Every token keeps its gradient; only its weight is clipped."""
    del num_seqs
    mask = jnp.asarray(loss_mask, jnp.float32)
    if num_tokens is None:
        num_tokens, _ = batch_normalizers(mask)
    adv = _per_token(advantages, logprobs.shape)
    log_ratio = jnp.where(mask > 0, logprobs - old_logprobs, 0.0)
    ratio = jnp.exp(log_ratio)
    weight = jax.lax.stop_gradient(jnp.clip(ratio, 1.0 - cfg.eps_low, 1.0 + cfg.eps_high))
    per_token = -weight * adv * jnp.where(mask > 0, logprobs, 0.0)
    loss = aggregate(per_token, mask, "token_mean", num_tokens=num_tokens)
    metrics = _common_metrics(ratio, log_ratio, mask, num_tokens, cfg.eps_low, cfg.eps_high)
    metrics["clip_frac"] = metrics["clip_frac_low"] + metrics["clip_frac_high"]
    metrics["pg_loss"] = loss
    if cfg.kl_coef > 0.0 and ref_logprobs is not None:
        kl_cfg = dataclasses.replace(cfg, aggregation="token_mean")
        kl_loss, _ = _kl_penalty(logprobs, ref_logprobs, mask, kl_cfg, num_tokens, None)
        metrics["kl_ref"] = kl_loss
        loss = loss + cfg.kl_coef * kl_loss
    return loss, metrics


POLICY_LOSSES = {"ppo": ppo_loss, "cispo": cispo_loss}
