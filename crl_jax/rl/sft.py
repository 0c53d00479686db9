"""Supervised fine-tuning: the jitted, sharded next-token step used by the warm start.

The loss is the mean negative log-likelihood over the trained tokens of the batch (the
`loss_mask` of a `PolicyBatch`; padding rows are masked by `valid`), i.e. behaviour cloning for
the actor and imitation of well-formed operations for the extractor. It shares the RL core's
state, log-prob computation and shardings, and skips non-finite updates the same way.

Legend: B rows, T tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from crl_jax.rl.batch import PolicyBatch, batch_shardings, make_policy_batch
from crl_jax.rl.logprobs import sequence_logprobs
from crl_jax.rl.state import TrainState, state_shardings


def sft_loss(params, graphdef, batch: PolicyBatch):
    """Mean NLL of the trained tokens, and the number of those tokens."""
    logp, _ = sequence_logprobs(graphdef, params, batch)
    mask = batch.loss_mask * batch.valid[:, None].astype(jnp.float32)
    tokens = mask.sum()
    return -(logp * mask).sum() / jnp.maximum(tokens, 1.0), tokens


def sft_step(state: TrainState, batch: PolicyBatch):
    (loss, tokens), grads = jax.value_and_grad(sft_loss, has_aux=True)(state.params, state.graphdef,
                                                                        batch)
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
    state = state.replace(step=state.step + finite.astype(jnp.int32),
                          params=keep(params, state.params), opt_state=keep(opt_state, state.opt_state))
    return state, {"loss": loss, "grad_norm": grad_norm, "tokens": tokens,
                   "skipped": 1.0 - finite.astype(jnp.float32)}


def make_sft_step(mesh: Mesh, state: TrainState, batch: PolicyBatch):
    """`sft_step` jitted for `batch`'s shapes with explicit shardings; the state is donated."""
    state_sh = state_shardings(mesh, state)
    return jax.jit(sft_step, in_shardings=(state_sh, batch_shardings(mesh, batch)),
                   out_shardings=(state_sh, NamedSharding(mesh, PartitionSpec())),
                   donate_argnums=(0,))


def sft_batch(examples, length: int, rows: int) -> PolicyBatch:
    """(ids, mask) or (ids, mask, positions) examples right-padded to [rows, length]; missing rows
    are invalid padding. Positions default to 0, 1, 2, ...; explicit ones let an example skip part
    of its sequence (warm_start.demos.action_windows with goals). Examples longer than `length` are
    cut (their cut tokens are not trained)."""
    if len(examples) > rows:
        raise ValueError(f"{len(examples)} examples do not fit a batch of {rows} rows")
    tokens = np.zeros((rows, length), np.int32)
    attention = np.zeros((rows, length), bool)
    loss = np.zeros((rows, length), np.float32)
    positions = np.tile(np.arange(length, dtype=np.int32), (rows, 1))
    for i, (ids, mask, *rest) in enumerate(examples):
        n = min(len(ids), length)
        tokens[i, :n], attention[i, :n], loss[i, :n] = ids[:n], True, np.asarray(mask[:n], np.float32)
        if rest:
            positions[i, :n] = np.asarray(rest[0][:n], np.int32)
    loss[:, 0] = 0.0
    valid = np.arange(rows) < len(examples)
    attention[~valid, 0] = True  # padding rows attend to one token, so no row is all-masked
    return make_policy_batch(tokens, loss, np.zeros(rows, np.float32), attention_mask=attention,
                             positions=positions, valid=valid)
