"""Warm start: the tiny models' analogue of starting RL from a pretrained instruct model.

Before the first RL step of a run whose models start from random weights:
  1. play `episodes` train-split tasks with the scripted experts, degraded by random actions
     (`demos.collect_demos`);
  2. behaviour-clone the actor on them: `window_steps` steps on the last `actor_window` tokens
     before each action (optional; cheap, and where reading the observation is learnt), then
     `actor_steps` steps on whole episodes (lessons, search calls, format in context);
  3. fine-tune the extractor on the scripted summariser's distillation, refinement and merge
     replies for the same episodes (`extractor_steps` steps), if the run has one, and probe it:
     the share of its distillations that parse on `PROBE_EPISODES` fresh scripted episodes, and
     of its merges of `PROBE_MERGES` chunks of lessons (`probe_extractor`), so a run whose
     extractor would write or merge nothing says so before RL;
and return the new parameters. Steps 1-2 do not depend on how the run later uses experience
(the demos always show the search tool, whether or not the run offers it), so every method of a
comparison on one seed (the GRPO baseline included) can start RL from the same actor, as the
paper's methods all start from one pretrained model.

The two halves are cached apart, as Orbax checkpoints with their losses and data counts as host
state: the actor's in `<workdir>/warm_start/actor`, keyed on `cache_identity(cfg)["actor"]`, and
the extractor's in `<workdir>/warm_start/extractor`, keyed on the whole identity (its training data
are the actor's demos). A later start of the run reuses them, a cache written under another
configuration is recomputed, and a copied-in actor cache is used as is: that is how
experiments/reproduce.py gives a baseline and a Comp. RL run of one seed the very same actor,
which retraining would not (XLA's multi-threaded CPU reductions are not bitwise reproducible, and
hundreds of steps amplify the last bit into a few points of success). Training curves go to
`metrics.jsonl` and TensorBoard in each half's folder. The summary carries a fingerprint of the
actor's weights (`params_fingerprint`), which the trainer logs, so a comparison made later from
the logs alone can tell whether two runs really started from the same actor.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from crl_jax.run import graceful_stop
from crl_jax.run import metrics as metrics_lib
from crl_jax.run.checkpoint import Checkpointer, CheckpointError, config_digest
from crl_jax.config import RunConfig, WarmStartConfig
from crl_jax.memory import ops, prompts
from crl_jax.rl.sft import make_sft_step, sft_batch
from crl_jax.rl.state import OptimizerConfig, TrainState, make_optimizer, state_shardings
from crl_jax.warm_start import demos as demos_lib

log = logging.getLogger("crl_jax")

__all__ = ["WarmStartInputs", "run_warm_start", "length_bucket", "rows_per_batch", "cache_identity",
           "probe_extractor", "params_fingerprint"]

# The extractor probe: this many scripted episodes it was not trained on (unguided, with more
# random actions than the demos, like the failing episodes RL starts from), each distilled once.
PROBE_EPISODES = 32
PROBE_EPSILONS = (0.25, 0.5, 1.0)
# ... and this many merge calls, each on 2 to warm_start.merge_lessons of the probed families'
# lessons (drawn afresh, so chunks the SFT did not show, of lessons it did).
PROBE_MERGES = 16
# Below this share of parsed distillations the bank would stay (nearly) empty: warn.
PROBE_WARN_BELOW = 0.25

# (extractor params, conversations) -> the extractor's reply to each, sampled as in RL.
Generate = Callable[[object, Sequence[Sequence[dict]]], list[str]]


# WarmStartConfig fields that only the extractor's half reads.
EXTRACTOR_SETTINGS = ("extractor_steps", "merge_examples", "merge_lessons", "extractor_learning_rate")


def _actor_settings(cfg: WarmStartConfig) -> dict:
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k not in EXTRACTOR_SETTINGS}


def cache_identity(cfg: RunConfig) -> dict:
    """Every setting of a run that its warm start depends on, from its config alone, by half:
    {"actor": ..., "extractor": ... or None (no extractor)}.

    Runs with equal halves build the same warm start of that half (up to the last bit of CPU
    reductions): the trainer keys each cache on it (plus the tokenizer's fingerprint, a property of
    the built vocabulary), and experiments/reproduce.py shares finished caches between runs by it.
    How a run uses experience afterwards (search, merging, frozen roles, ...) is left out: the
    actor's demos do not depend on it.
    """
    actor = {"warm_start": _actor_settings(cfg.warm_start), "tasks": list(cfg.tasks), "seed": cfg.seed,
             "tokenizer": cfg.tokenizer, "actor": dataclasses.asdict(cfg.actor),
             "max_turns": cfg.rollout.max_turns, "actor_max_len": cfg.rl.max_seq_len}
    extractor = None
    if cfg.memory.enabled:
        extractor = {"warm_start": {k: getattr(cfg.warm_start, k) for k in EXTRACTOR_SETTINGS},
                     "model": dataclasses.asdict(cfg.extractor_model),
                     "cache_length": cfg.extractor.cache_length,
                     "max_new_tokens": cfg.extractor.max_new_tokens}
    return {"actor": actor, "extractor": extractor}


@dataclasses.dataclass
class WarmStartInputs:
    """Everything the warm start needs from the trainer."""

    tokenizer: object
    mesh: object
    actor_state: TrainState
    extractor_state: TrainState | None   # None: no extractor to fine-tune (memory disabled)
    train_tasks: list[dict]              # train-split task specs ({"env", "seed"})
    max_turns: int
    actor_max_len: int                   # longest actor sequence trained (rl.max_seq_len)
    extractor_room: int                  # extractor prompt budget (cache - new tokens)
    extractor_max_len: int
    seed: int
    identity: dict                       # what the cached halves depend on (cache_identity)
    extractor_mesh: object = None        # the extractor's own mesh (disjoint roles); None = `mesh`
    generate: Generate | None = None     # generation with the run's extractor sampler (the probe)
    # The signal that asks the run to stop (0: none), read between the halves: the actor's is
    # cached by then, so a stop there loses no finished work (see crl_jax.run.graceful_stop).
    stop_signal: Callable[[], int] | None = None


def length_bucket(n: int, cap: int, granule: int = 256) -> int:
    """The padded length for a sequence of `n` tokens: the next multiple of `granule`, at most
    `cap`. Coarse enough that a run compiles each step for a handful of shapes only."""
    return min(max(granule, -(-n // granule) * granule), cap)


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


def probe_extractor(params, generate: Generate, tasks: Sequence[dict], *, max_turns: int, seed: int,
                    merges: int = PROBE_MERGES, merge_lessons: int = 4) -> dict:
    """Parse outcomes of the extractor's distillations of fresh scripted episodes of `tasks`
    (ops.parse_operations reasons) and of its merges of `merges` chunks of 2 to `merge_lessons`
    of their families' lessons (ops.parse_merge reasons); `parsed` and `merge_parsed` are the
    shares that parse (an operation or return(); merged items or <<<RETURN>>>).

    The warm start's SFT loss does not say whether the extractor writes well-formed operations:
    with six task families, 120 steps ended at loss 1.7 and no distillation of a run parsed; and
    with 16 merge examples among ~700, none of a run's merges parsed."""
    if merges and merge_lessons < 2:
        raise ValueError(f"a merge chunk needs >= 2 lessons; got merge_lessons={merge_lessons}")
    demos = demos_lib.collect_demos(tasks, max_turns=max_turns, epsilons=PROBE_EPSILONS,
                                    guided_fraction=0.0, search_fraction=0.0, tools=True, seed=seed)
    replies = generate(params, [prompts.distill_messages(d.facts.success, d.messages, []) for d in demos])
    parses = [ops.parse_operations(text, 0) for text in replies]
    out = {"episodes": len(demos), "parsed": sum(p.ok for p in parses) / max(1, len(demos)),
           "outcomes": dict(collections.Counter(p.reason for p in parses))}
    chunks = demos_lib.lesson_chunks(sorted({t["env"] for t in tasks}), merges, merge_lessons,
                                     np.random.default_rng([seed, 11]))
    if chunks:
        reasons = [ops.parse_merge(text)[1] for text in
                   generate(params, [prompts.merge_messages([demos_lib.render(e) for e in c])
                                     for c in chunks])]
        out.update(merges=len(chunks), merge_parsed=sum(r in ("ok", "return") for r in reasons) / len(chunks),
                   merge_outcomes=dict(collections.Counter(reasons)))
    return out


def _digest(settings: dict, identity: dict, inputs: WarmStartInputs) -> str:
    # The settings passed in, not only the run's identity, so a direct call with another
    # WarmStartConfig cannot pick up a cache built under different settings; and the tokenizer
    # itself, since the same config built a different one before the word tokenizer spelled out
    # unknown words (a cache copied from such a run is recomputed).
    return config_digest({"identity": identity, "warm_start": settings,
                          "tokenizer": inputs.tokenizer.fingerprint})


class _Cache:
    """One half's folder: its checkpoint (params + summary) and its training curves."""

    def __init__(self, folder: str, digest: str):
        self.folder, self.digest = folder, digest
        self.checkpointer = self._open()

    def _open(self) -> Checkpointer:
        return Checkpointer(os.path.join(self.folder, "checkpoint"), max_to_keep=1, async_save=False,
                            digest=self.digest)

    def load(self, params) -> tuple[object, dict] | None:
        """(params, summary) if a usable cache is there; an unusable one is deleted."""
        if self.checkpointer.latest_step() is None:
            return None
        try:
            _, tree, summary = self.checkpointer.restore({"params": params})
        except CheckpointError as err:
            log.warning("warm start cache in %s is unusable (%s); recomputing", self.folder, err)
            self.checkpointer.close()
            shutil.rmtree(self.folder)
            self.checkpointer = self._open()
            return None
        log.info("warm start: reusing %s (built in %.0f s)", self.folder, summary.get("time_s", 0.0))
        return tree["params"], summary

    def save(self, params, summary: dict) -> None:
        self.checkpointer.save(1, {"params": params}, summary)
        self.checkpointer.wait()


def params_fingerprint(params) -> int | None:
    """A 48-bit fingerprint of `params`: sha256 over each leaf's path, dtype, shape and bytes, cut
    to 48 bits so that it is exact as a float64 metric. Equal fingerprints mean bitwise-equal
    weights (up to a 2^-48 chance). None where a leaf is not wholly held by this process (a
    multi-host model; the warm start is meant for tiny ones)."""
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            return None
        value = np.ascontiguousarray(jax.device_get(leaf))
        digest.update(f"{jax.tree_util.keystr(path)}|{value.dtype}|{value.shape}|".encode())
        digest.update(value.tobytes())
    return int(digest.hexdigest()[:12], 16)


def _result(actor: tuple, extractor: tuple | None):
    """(actor params, extractor params or None, summary) from each half's (params, summary): the
    actor's summary with its weights' fingerprint, the extractor's under "extractor", and the
    halves' total wall time."""
    summary = {k: v for k, v in actor[1].items() if k != "time_s"}
    summary["actor_fingerprint"] = params_fingerprint(actor[0])
    summary["time_s"] = actor[1].get("time_s", 0.0)
    if extractor is None:
        return actor[0], None, summary
    summary["extractor"] = extractor[1]["extractor"]
    summary["time_s"] += extractor[1].get("time_s", 0.0)
    return actor[0], extractor[0], summary


def run_warm_start(cfg: WarmStartConfig, inputs: WarmStartInputs, workdir: str):
    """(actor params, extractor params or None, summary dict): each half cached in
    `workdir/warm_start/{actor,extractor}` and trained only where its cache is missing. Raises
    graceful_stop.Stopped (next step 0) where `inputs.stop_signal` asks to stop between them."""
    folder = os.path.join(workdir, "warm_start")
    actor_cache = _Cache(os.path.join(folder, "actor"),
                         _digest(_actor_settings(cfg), inputs.identity["actor"], inputs))
    actor = actor_cache.load(inputs.actor_state.params)
    extractor_cache, extractor = None, None
    if inputs.extractor_state is not None:
        extractor_cache = _Cache(os.path.join(folder, "extractor"),
                                 _digest(dataclasses.asdict(cfg), inputs.identity, inputs))
        extractor = extractor_cache.load(inputs.extractor_state.params)
    if actor is not None and (extractor_cache is None or extractor is not None):
        return _result(actor, extractor)

    started = time.perf_counter()
    tasks = [inputs.train_tasks[i % len(inputs.train_tasks)] for i in range(cfg.episodes)]
    log.info("warm start: playing %d scripted episodes (random-action rates %s)", len(tasks),
             ", ".join(f"{e:g}" for e in cfg.epsilons))
    demos = demos_lib.collect_demos(
        tasks, max_turns=inputs.max_turns, epsilons=cfg.epsilons, guided_fraction=cfg.guided_fraction,
        search_fraction=cfg.search_fraction, tools=True, seed=inputs.seed)
    demo_stats = {"episodes": len(demos),
                  "success": float(np.mean([d.facts.success for d in demos])),
                  "actions": float(np.mean([d.facts.actions for d in demos])),
                  "guided": int(sum(d.entry is not None for d in demos)),
                  "searched": int(sum(d.searched for d in demos)),
                  "play_s": time.perf_counter() - started}
    log.info("warm start: demos success %.2f, %.1f actions, %d guided, %d with search-and-ask",
             demo_stats["success"], demo_stats["actions"], demo_stats["guided"], demo_stats["searched"])
    if actor is None:
        actor = _train_actor(cfg, inputs, demos, actor_cache.folder, started)
        actor[1]["demos"] = demo_stats
        actor_cache.save(*actor)
    if extractor_cache is not None and extractor is None:
        signum = inputs.stop_signal() if inputs.stop_signal is not None else 0
        if signum:
            raise graceful_stop.Stopped(signum, 0)
        extractor = _train_extractor(cfg, inputs, demos, extractor_cache.folder, time.perf_counter())
        extractor_cache.save(*extractor)
    log.info("warm start: done in %.0f s (actor loss %s -> %s)", time.perf_counter() - started,
             actor[1]["actor"]["loss_first"], actor[1]["actor"]["loss_last"])
    return _result(actor, extractor)


def _train_actor(cfg: WarmStartConfig, inputs: WarmStartInputs, demos, folder: str, started: float):
    """Behaviour cloning on the demos: (params, summary); curves in `folder`."""
    writer = metrics_lib.MetricsWriter(folder)
    writer.resume_from(-1)
    actor_examples = demos_lib.actor_examples(inputs.tokenizer, demos)
    actor_state, summary = inputs.actor_state, {}
    if cfg.window_steps > 0:
        window = min(cfg.actor_window, inputs.actor_max_len)
        if cfg.window_goal:
            # Goal message + window: lengths vary, so batches share a budget of tokens (as many
            # as `window_batch_size` plain windows) instead of a number of rows.
            goals = demos_lib.goal_spans(inputs.tokenizer, demos)
            sizing = dict(max_len=inputs.actor_max_len, granule=128,
                          tokens_per_batch=cfg.window_batch_size * window)
        else:
            goals, sizing = None, dict(max_len=window, granule=window)
        params, summary["actor_window"] = train_supervised(
            "actor_window", actor_state,
            demos_lib.action_windows(actor_examples, window, goals, max_len=inputs.actor_max_len),
            steps=cfg.window_steps, batch_size=cfg.window_batch_size, learning_rate=cfg.learning_rate,
            mesh=inputs.mesh, seed=inputs.seed, writer=writer, step_offset=0, **sizing)
        actor_state = actor_state.replace(params=params)
    params, summary["actor"] = train_supervised(
        "actor", actor_state, actor_examples, steps=cfg.actor_steps, batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate, max_len=inputs.actor_max_len, mesh=inputs.mesh,
        seed=inputs.seed, writer=writer, step_offset=cfg.window_steps)
    writer.close()
    summary["time_s"] = time.perf_counter() - started
    return params, summary


def _train_extractor(cfg: WarmStartConfig, inputs: WarmStartInputs, demos, folder: str, started: float):
    """SFT on the scripted summariser's replies for the demos, then the probe: (params, summary);
    curves in `folder`, numbered after the actor's steps."""
    writer = metrics_lib.MetricsWriter(folder)
    writer.resume_from(-1)
    examples, counts = demos_lib.extractor_examples(
        inputs.tokenizer, demos, room=inputs.extractor_room, merges=cfg.merge_examples,
        merge_lessons=cfg.merge_lessons, seed=inputs.seed)
    params, ext_summary = train_supervised(
        "extractor", inputs.extractor_state, examples, steps=cfg.extractor_steps,
        batch_size=cfg.batch_size, learning_rate=cfg.extractor_learning_rate,
        max_len=inputs.extractor_max_len, mesh=inputs.extractor_mesh or inputs.mesh,
        seed=inputs.seed + 1, writer=writer,
        step_offset=cfg.window_steps + cfg.actor_steps)
    writer.close()
    summary = {**ext_summary, **counts}
    if inputs.generate is not None:
        # Train tasks after the demos' (the same ones again when the split is smaller),
        # played with other random actions: transcripts the extractor was not trained on.
        probe_tasks = [inputs.train_tasks[(cfg.episodes + i) % len(inputs.train_tasks)]
                       for i in range(PROBE_EPISODES)]
        probe = probe_extractor(params, inputs.generate, probe_tasks, max_turns=inputs.max_turns,
                                seed=inputs.seed + 99, merge_lessons=cfg.merge_lessons)
        summary["probe"] = probe
        log.info("warm start: the extractor's distillations of %d fresh episodes: %.0f%% parse (%s)",
                 probe["episodes"], 100 * probe["parsed"],
                 ", ".join(f"{k} {v}" for k, v in sorted(probe["outcomes"].items())))
        log.info("warm start: the extractor's merges of %d chunks of lessons: %.0f%% parse (%s)",
                 probe["merges"], 100 * probe["merge_parsed"],
                 ", ".join(f"{k} {v}" for k, v in sorted(probe["merge_outcomes"].items())))
        if probe["parsed"] < PROBE_WARN_BELOW:
            log.warning("warm start: only %.0f%% of the extractor's distillations parse, so the bank "
                        "will stay nearly empty; raise warm_start.extractor_steps", 100 * probe["parsed"])
    return params, {"extractor": summary, "time_s": time.perf_counter() - started}
