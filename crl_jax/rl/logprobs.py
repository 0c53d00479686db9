"""Per-token log-probabilities of a batch under a model, without materialising [B, T, V] logits.

The RL losses need log pi(token_t | prefix) only for the realised tokens. At paper scale
(T = 32k, V = 152k) the full float32 logits of one sequence take 20 GB, so the LM head is applied
in time chunks inside a rematerialised scan: the forward keeps one [B, C, V] chunk alive at a time
and the backward recomputes it. A chunk of 0 disables chunking (one chunk spanning the sequence).
An RL loss reads few of those positions: `logprobs_at_loss_tokens` runs the head at those only.

Legend: B batch, T time, C time chunk, D model, V vocab.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from crl_jax.rl.batch import PolicyBatch


def _head_weight(model):
    cfg = model.config
    head = model.embed.value.T if cfg.tie_embeddings else model.lm_head.value
    return head.astype(cfg.compute_dtype)


def _chunk_stats(hidden, head, targets, with_entropy: bool):
    """hidden [B,C,D], targets [B,C] -> (log-prob of target [B,C], entropy [B,C] or zeros)."""
    logits = jnp.einsum("bcd,dv->bcv", hidden, head, preferred_element_type=jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    if with_entropy:
        probs = jax.nn.softmax(logits, axis=-1)
        entropy = lse - (probs * logits).sum(-1)
    else:
        entropy = jnp.zeros_like(lse)
    return picked - lse, entropy


def logprobs_from_hidden(hidden, head, tokens, *, chunk: int = 0, with_entropy: bool = False):
    """hidden [B,T,D] (final-norm output), head [D,V], tokens [B,T] -> (logp [B,T], entropy [B,T]).

    Position t holds the prediction of tokens[:, t] from hidden[:, t-1]; position 0 is 0.
    """
    b, t, d = hidden.shape
    h, targets = hidden[:, :-1], tokens[:, 1:].astype(jnp.int32)
    steps = t - 1
    c = steps if chunk <= 0 or chunk >= steps else chunk
    n = -(-steps // c)
    pad = n * c - steps
    if pad:
        h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
    stats = functools.partial(_chunk_stats, with_entropy=with_entropy)
    if n == 1:
        # One chunk: the whole [B, T, V] block is live in the forward anyway, so keeping it for
        # the backward costs no extra peak and saves recomputing the head matmul.
        logp, ent = stats(h, head, targets)
    else:
        hs = jnp.swapaxes(h.reshape(b, n, c, d), 0, 1)
        ts = jnp.swapaxes(targets.reshape(b, n, c), 0, 1)
        stats = jax.checkpoint(stats)  # the backward recomputes one chunk at a time
        _, (logp, ent) = jax.lax.scan(lambda carry, xs: (carry, stats(xs[0], head, xs[1])),
                                      None, (hs, ts))
        logp = jnp.swapaxes(logp, 0, 1).reshape(b, n * c)
        ent = jnp.swapaxes(ent, 0, 1).reshape(b, n * c)
    pad_front = ((0, 0), (1, 0))
    return jnp.pad(logp[:, :steps], pad_front), jnp.pad(ent[:, :steps], pad_front)


def logprobs_at_loss_tokens(hidden, head, tokens, loss_mask, *, positions: int, chunk: int = 0,
                            with_entropy: bool = False):
    """`logprobs_from_hidden` with the LM head and its log-softmax run only where the loss reads
    them (loss_mask > 0), at up to `positions` tokens gathered from the whole batch; log-probs
    and entropies are 0 elsewhere, where the loss weighs them by 0. An RL batch trains a few
    response tokens of long multi-turn rows, so this skips most of the head. A batch with more
    loss tokens than `positions` takes the every-position path instead (a `lax.cond`, one
    program either way), so no token is ever dropped."""
    b, t, d = hidden.shape
    flat_hidden = hidden[:, :-1].reshape(b * (t - 1), d)
    targets = jnp.asarray(tokens)[:, 1:].astype(jnp.int32).reshape(-1)
    wanted = jnp.asarray(loss_mask)[:, 1:].reshape(-1) > 0
    count = wanted.sum()
    where = jnp.nonzero(wanted, size=positions, fill_value=0)[0]      # [positions], slot order
    real = jnp.arange(positions) < count

    def gathered():
        logp, ent = _chunk_stats(flat_hidden[where][None], head, targets[where][None], with_entropy)
        # Scatter-add, with the filler slots adding 0: a filler points at a real position.
        back = lambda x: jnp.pad(jnp.zeros(b * (t - 1), x.dtype).at[where].add(  # noqa: E731
            jnp.where(real, x[0], 0.0)).reshape(b, t - 1), ((0, 0), (1, 0)))
        logp = back(logp)
        return logp, back(ent) if with_entropy else jnp.zeros_like(logp)

    def every_position():
        return logprobs_from_hidden(hidden, head, tokens, chunk=chunk, with_entropy=with_entropy)

    # Rematerialised branches: differentiating a cond makes both branches output the residuals
    # either one keeps, so without remat the gathered branch would write zeros as large as the
    # every-position branch's [B, T, V] logits.
    return jax.lax.cond(count <= positions, jax.checkpoint(gathered), jax.checkpoint(every_position))


def sequence_logprobs(graphdef: nnx.GraphDef, params, batch: PolicyBatch, *, chunk: int = 0,
                      with_entropy: bool = False, loss_positions: int = 0):
    """Token log-probs (and optionally entropies) [B, T] of `batch` under (graphdef, params).
    With `loss_positions` > 0, only at `batch.loss_mask`'s tokens (`logprobs_at_loss_tokens`)."""
    model = nnx.merge(graphdef, params)
    hidden = model(batch.tokens, positions=batch.positions, attention_mask=batch.attention_mask,
                   return_hidden=True)
    if loss_positions:
        return logprobs_at_loss_tokens(hidden, _head_weight(model), batch.tokens, batch.loss_mask,
                                       positions=loss_positions, chunk=chunk,
                                       with_entropy=with_entropy)
    return logprobs_from_hidden(hidden, _head_weight(model), batch.tokens, chunk=chunk,
                                with_entropy=with_entropy)


@functools.partial(jax.jit, static_argnames=("chunk",))
def compute_logprobs(state, batch: PolicyBatch, *, chunk: int = 0):
    """Jitted log-probs [B, T] of `batch` under `state`'s current params (old or reference
    log-probs for a later update); no gradient is taken."""
    logp, _ = sequence_logprobs(state.graphdef, state.params, batch, chunk=chunk)
    return logp
