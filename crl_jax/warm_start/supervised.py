"""The warm start's supervised loop: length-bucketed batches of (tokens, loss mask) examples, a
fresh AdamW, and the SFT step of crl_jax/rl/sft.py; curves to a MetricsWriter, with progress."""

from __future__ import annotations

import jax
import numpy as np

from crl_jax.rl.sft import make_sft_step, sft_batch
from crl_jax.rl.state import OptimizerConfig, TrainState, make_optimizer, state_shardings
from crl_jax.run import metrics as metrics_lib
from crl_jax.shapes import length_bucket


def rows_per_batch(length: int, batch_size: int, tokens_per_batch: int = 0) -> int:
    """Rows of a batch padded to `length`: `batch_size`, or with a token budget as many as fit it
    (at least one, at most `batch_size`), so short and long examples cost about the same per step."""
    if tokens_per_batch <= 0:
        return batch_size
    return max(1, min(batch_size, tokens_per_batch // length))


def _batches(examples, batch_size: int, cap: int, rng: np.random.Generator, granule: int = 256,
             tokens_per_batch: int = 0):
    """Endless shuffled batches, each from one length bucket (few shapes, so few compilations)."""
    by_bucket: dict[int, list[int]] = {}
    for i, (ids, *_) in enumerate(examples):
        by_bucket.setdefault(length_bucket(len(ids), cap, granule), []).append(i)
    while True:
        batches = []
        for length, rows in by_bucket.items():
            rows = list(rng.permutation(rows))
            n = rows_per_batch(length, batch_size, tokens_per_batch)
            batches += [(length, rows[k:k + n]) for k in range(0, len(rows), n)]
        for b in rng.permutation(len(batches)):
            yield batches[b]


def train_supervised(name: str, state: TrainState, examples, *, steps: int, batch_size: int,
                     learning_rate: float, max_len: int, mesh, seed: int,
                     writer: metrics_lib.MetricsWriter, step_offset: int,
                     granule: int = 256, tokens_per_batch: int = 0) -> tuple[object, dict]:
    """`steps` supervised updates of `state`'s params on `examples`; returns (params, summary).
    The RL optimiser state is untouched: the warm start has its own AdamW. Batches are padded to
    a multiple of `granule` tokens (at most `max_len`) and hold `batch_size` rows, or with
    `tokens_per_batch` as many as fit that many tokens (`rows_per_batch`)."""
    tx = make_optimizer(OptimizerConfig(learning_rate=learning_rate, max_grad_norm=1.0))
    sft_state = TrainState.create(state.graphdef, state.params, tx, jax.random.PRNGKey(seed))
    # Its fresh Adam moments are sharded like the params they track (the step donates the state,
    # so the caller's params are consumed: it takes the returned ones).
    sft_state = jax.device_put(sft_state, state_shardings(mesh, sft_state))
    step_fns: dict[int, object] = {}
    batches = _batches(examples, batch_size, max_len, np.random.default_rng([seed, 11]), granule,
                       tokens_per_batch)
    losses = []
    progress = metrics_lib.Progress(steps, keys=(f"{name}/loss",), every=max(1, steps // 10))
    for i in range(steps):
        length, rows = next(batches)
        batch = sft_batch([examples[r] for r in rows], length,
                          rows_per_batch(length, batch_size, tokens_per_batch))
        if length not in step_fns:
            step_fns[length] = make_sft_step(mesh, sft_state, batch)
        sft_state, out = step_fns[length](sft_state, batch)
        out = {f"{name}/{k}": float(v) for k, v in jax.device_get(out).items()}
        losses.append(out[f"{name}/loss"])
        writer.write(step_offset + i, out)
        progress.update(i + 1, out)
    progress.close()
    head = losses[:max(1, len(losses) // 10)]
    tail = losses[-max(1, len(losses) // 10):]
    return sft_state.params, {"steps": steps, "examples": len(examples),
                              "loss_first": float(np.mean(head)) if losses else None,
                              "loss_last": float(np.mean(tail)) if losses else None}
