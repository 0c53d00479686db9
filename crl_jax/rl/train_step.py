"""The joint RL update: one pure `train_step` for the actor (subgroup GRPO + PPO-clip) and, when an
extractor batch is present, the extractor (centred reward x training-count weight + CISPO).

Each model's update: advantages over the whole batch -> loss and gradient, accumulated over
micro-batches with `lax.scan` -> guard -> AdamW. A non-finite loss or gradient, or a zero gradient
(a batch without learning signal: every advantage 0), leaves that model's params and optimiser
state bit-identical (selected with `where`) and sets `<model>/skipped` (`<model>/no_signal` for the
latter). Adam given a zero gradient still moves every parameter by about the learning rate along
its momentum, for tens of steps: on the diagnostic, steps where every episode failed went on
moving the actor until it stopped writing `<answer>` (docs/diagnostic.md).

Why `lax.scan` rather than `optax.MultiSteps` for accumulation: MultiSteps spreads one update over
several calls (one dispatch per micro-batch, a param-sized accumulator kept in the optimiser state
between calls, and the clip / non-finite guard only ever seeing the final sum on the last call).
A scan inside one compiled step keeps the accumulator transient, lets the losses use the whole
batch's token and sequence counts (so accumulation equals the unsplit batch exactly), and gives
the guard the full gradient.

Old log-probs: "sampler" uses `batch.old_logprobs` as given; "recompute" uses the log-probs under
the pre-update params. With one optimiser step per batch (the paper's ppo_epochs = 1) those are the
current params, so the recomputed values are exactly stop_gradient of the log-probs the loss
computes anyway: the ratio is 1 and no second forward pass is spent.

Legend: B batch, T time.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from crl_jax.rl import advantages as adv_lib
from crl_jax.rl.batch import PolicyBatch, TrainBatch, batch_shardings, split_micro_batches
from crl_jax.rl.logprobs import sequence_logprobs
from crl_jax.rl.losses import POLICY_LOSSES, LossConfig, aggregate, batch_normalizers
from crl_jax.rl.state import TrainState, state_shardings

OLD_LOGPROBS = ("sampler", "recompute")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    actor_loss: LossConfig = LossConfig("ppo", 0.2, 0.2, "seq_mean_token_mean")
    extractor_loss: LossConfig = LossConfig("cispo", 0.1, 0.1, "token_mean")
    advantage_normalization: str = "mean_std"  # paper; the released code uses "mean"
    advantage_split: str = "subgroup"          # ablations: "group" (no split), "batch"
    advantage_eps: float = 1e-6
    actor_micro_batches: int = 1
    extractor_micro_batches: int = 1
    old_logprobs: str = "recompute"
    logprob_chunk: int = 0                     # LM-head time chunk; 0 = whole sequence at once
    logprob_positions: int = 0                 # head only at up to this many loss tokens; 0 = all
    log_entropy: bool = False
    update_actor: bool = True                  # False: "experience only", the actor stays frozen
    # Batches split along T, not rows (DecoderConfig.context_parallel): one long sequence per
    # micro-batch spread over the context axis.
    context_parallel: bool = False

    def __post_init__(self):
        problems = [f"actor_loss: {p}" for p in self.actor_loss.problems()]
        problems += [f"extractor_loss: {p}" for p in self.extractor_loss.problems()]
        if self.advantage_normalization not in adv_lib.NORMALIZATIONS:
            problems.append(f"advantage_normalization must be one of {adv_lib.NORMALIZATIONS}, "
                            f"got {self.advantage_normalization!r}")
        if self.advantage_split not in adv_lib.SPLITS:
            problems.append(f"advantage_split must be one of {adv_lib.SPLITS}, "
                            f"got {self.advantage_split!r}")
        for name in ("actor_micro_batches", "extractor_micro_batches"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                problems.append(f"{name} must be an int >= 1, got {getattr(self, name)!r}")
        if self.old_logprobs not in OLD_LOGPROBS:
            problems.append(f"old_logprobs must be one of {OLD_LOGPROBS}, got {self.old_logprobs!r}")
        if not isinstance(self.logprob_chunk, int) or self.logprob_chunk < 0:
            problems.append(f"logprob_chunk must be an int >= 0, got {self.logprob_chunk!r}")
        if not isinstance(self.logprob_positions, int) or self.logprob_positions < 0:
            problems.append(f"logprob_positions must be an int >= 0, got {self.logprob_positions!r}")
        if problems:
            raise ValueError("invalid TrainConfig:\n  " + "\n  ".join(problems))


def _loss_and_grads(state: TrainState, batch: PolicyBatch, advantages, loss_cfg: LossConfig,
                    n_micro: int, cfg: TrainConfig):
    """Summed loss metrics and float32 gradients of the whole batch, accumulated over micro-batches."""
    num_tokens, num_seqs = batch_normalizers(batch.loss_mask)
    policy_loss = POLICY_LOSSES[loss_cfg.name]

    def loss_fn(params, mb: PolicyBatch, adv):
        logp, entropy = sequence_logprobs(state.graphdef, params, mb, chunk=cfg.logprob_chunk,
                                          with_entropy=cfg.log_entropy,
                                          loss_positions=cfg.logprob_positions)
        old = jax.lax.stop_gradient(logp) if cfg.old_logprobs == "recompute" else mb.old_logprobs
        loss, metrics = policy_loss(logp, old, adv, mb.loss_mask, cfg=loss_cfg,
                                    ref_logprobs=mb.ref_logprobs, num_tokens=num_tokens,
                                    num_seqs=num_seqs)
        if cfg.log_entropy:
            metrics["entropy"] = aggregate(jax.lax.stop_gradient(entropy), mb.loss_mask,
                                           "token_mean", num_tokens=num_tokens)
        metrics["loss"] = loss
        return loss, metrics

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    to_f32 = lambda tree: jax.tree.map(lambda x: x.astype(jnp.float32), tree)  # noqa: E731
    if n_micro == 1:
        (_, metrics), grads = grad_fn(state.params, batch, advantages)
        return metrics, to_f32(grads)

    micro = split_micro_batches(batch, n_micro)
    micro_adv = jnp.swapaxes(advantages.reshape(-1, n_micro), 0, 1)

    def body(acc, xs):
        (_, metrics), grads = grad_fn(state.params, *xs)
        return jax.tree.map(jnp.add, acc, (to_f32(grads), metrics)), None

    first = jax.tree.map(lambda x: x[0], (micro, micro_adv))
    shapes = jax.eval_shape(lambda: (to_f32(state.params), grad_fn(state.params, *first)[0][1]))
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    (grads, metrics), _ = jax.lax.scan(body, zeros, (micro, micro_adv))
    return metrics, grads


def _update_model(state: TrainState, batch: PolicyBatch, advantages, loss_cfg: LossConfig,
                  n_micro: int, cfg: TrainConfig):
    batch = batch.replace(loss_mask=batch.loss_mask * batch.valid[:, None].astype(jnp.float32))
    metrics, grads = _loss_and_grads(state, batch, advantages, loss_cfg, n_micro, cfg)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
    signal = grad_norm > 0
    apply = finite & signal
    updates, new_opt_state = state.tx.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    keep_if_bad = lambda new, old: jax.tree.map(  # noqa: E731
        lambda a, b: jnp.where(apply, a, b), new, old)
    new_state = state.replace(step=state.step + apply.astype(jnp.int32),
                              params=keep_if_bad(new_params, state.params),
                              opt_state=keep_if_bad(new_opt_state, state.opt_state))
    valid = batch.valid.astype(jnp.float32)
    metrics.update(
        grad_norm=grad_norm, skipped=1.0 - apply.astype(jnp.float32),
        no_signal=1.0 - signal.astype(jnp.float32),
        num_tokens=batch.loss_mask.sum(),
        reward_mean=(batch.rewards * valid).sum() / jnp.maximum(valid.sum(), 1.0),
        advantage_abs_mean=(jnp.abs(advantages) * valid).sum() / jnp.maximum(valid.sum(), 1.0))
    return new_state, metrics


def train_step(actor_state: TrainState, extractor_state: TrainState, batch: TrainBatch, *,
               cfg: TrainConfig):
    """One update of the actor and, if `batch.extractor` is not None, of the extractor.

    Returns (actor_state, extractor_state, metrics); metric names are prefixed "actor/" and
    "extractor/" (the latter only when the extractor was trained).
    """
    metrics = {}
    if cfg.update_actor:
        a = batch.actor
        advantages = adv_lib.group_advantages(
            a.rewards, a.group_ids, a.guided, a.valid, normalization=cfg.advantage_normalization,
            split=cfg.advantage_split, eps=cfg.advantage_eps) * a.weights
        actor_state, actor_metrics = _update_model(actor_state, a, advantages, cfg.actor_loss,
                                                   cfg.actor_micro_batches, cfg)
        metrics.update({f"actor/{k}": v for k, v in actor_metrics.items()})
    if batch.extractor is not None:
        e = batch.extractor
        ext_adv = adv_lib.extractor_advantages(e.rewards, e.weights, e.valid)
        extractor_state, ext_metrics = _update_model(extractor_state, e, ext_adv,
                                                     cfg.extractor_loss,
                                                     cfg.extractor_micro_batches, cfg)
        metrics.update({f"extractor/{k}": v for k, v in ext_metrics.items()})
    return actor_state, extractor_state, metrics


def make_train_step(cfg: TrainConfig, mesh: Mesh, actor_state, extractor_state, batch: TrainBatch):
    """`train_step` jitted once for the structure of `batch` (with or without an extractor part),
    with explicit shardings on `mesh` and both states donated. The states and batch may be concrete
    or abstract (jax.ShapeDtypeStruct); they only supply shapes and structure. Without an extractor
    batch the extractor state may be None (an actor-only step)."""
    if batch.extractor is not None and extractor_state is None:
        raise ValueError("an extractor batch needs an extractor state")
    for name, n, loss, part in (
            ("actor", cfg.actor_micro_batches, cfg.actor_loss, batch.actor),
            ("extractor", cfg.extractor_micro_batches, cfg.extractor_loss, batch.extractor)):
        if part is not None and part.tokens.shape[0] % n:
            raise ValueError(f"{name} batch size {part.tokens.shape[0]} is not divisible by "
                             f"{name}_micro_batches={n}")
        if part is not None and loss.kl_coef > 0 and part.ref_logprobs is None:
            raise ValueError(f"{name}_loss.kl_coef > 0 needs ref_logprobs in the {name} batch")
    state_sh = tuple(None if s is None else state_shardings(mesh, s)
                     for s in (actor_state, extractor_state))
    batch_sh = batch_shardings(mesh, batch, context_parallel=cfg.context_parallel)
    replicated = NamedSharding(mesh, PartitionSpec())
    # Without an extractor part the extractor state passes through untouched; it is not donated,
    # so its params stay valid for extractor inference running concurrently (distillation).
    donate = (0, 1) if batch.extractor is not None else (0,)
    return InMesh(jax.jit(functools.partial(train_step, cfg=cfg),
                          in_shardings=(*state_sh, batch_sh), out_shardings=(*state_sh, replicated),
                          donate_argnums=donate), mesh)


class InMesh:
    """A jitted function traced and lowered with its mesh in context (`jax.set_mesh`), so that
    code which shards itself by hand, splash attention under shard_map, finds the mesh."""

    def __init__(self, jitted, mesh: Mesh):
        self.jitted, self.mesh = jitted, mesh

    def __call__(self, *args):
        with jax.set_mesh(self.mesh):
            return self.jitted(*args)

    def lower(self, *args):
        with jax.set_mesh(self.mesh):
            return self.jitted.lower(*args)
