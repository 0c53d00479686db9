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

import dataclasses
import logging
import os
import time
from collections.abc import Callable

import numpy as np

from crl_jax.config import RunConfig, WarmStartConfig
from crl_jax.rl.state import TrainState
from crl_jax.run import graceful_stop
from crl_jax.run import metrics as metrics_lib
from crl_jax.warm_start import demos as demos_lib
from crl_jax.warm_start.cache import (HalfCache, actor_settings, cache_digest, cache_identity,
                                      params_fingerprint)
from crl_jax.warm_start.probe import (PROBE_EPISODES, PROBE_MERGES, PROBE_WARN_BELOW, Generate,
                                      probe_extractor)
from crl_jax.warm_start.supervised import rows_per_batch, train_supervised

log = logging.getLogger("crl_jax")

__all__ = ["WarmStartInputs", "run_warm_start", "warm_start_states", "summary_metrics", "rows_per_batch",
           "cache_identity", "probe_extractor", "params_fingerprint", "PROBE_EPISODES", "PROBE_MERGES"]


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
    # Sibling runs' workdirs whose finished halves this one may take (HalfCache.adopt).
    cache_from: tuple[str, ...] = ()


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
    fingerprint = inputs.tokenizer.fingerprint
    actor_cache = HalfCache(os.path.join(folder, "actor"),
                            cache_digest(actor_settings(cfg), inputs.identity["actor"], fingerprint))
    actor = (actor_cache.load(inputs.actor_state.params)
             or actor_cache.adopt(inputs.actor_state.params, inputs.cache_from, "actor"))
    extractor_cache, extractor = None, None
    if inputs.extractor_state is not None:
        extractor_cache = HalfCache(os.path.join(folder, "extractor"),
                                    cache_digest(dataclasses.asdict(cfg), inputs.identity, fingerprint))
        extractor = (extractor_cache.load(inputs.extractor_state.params)
                     or extractor_cache.adopt(inputs.extractor_state.params, inputs.cache_from, "extractor"))
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
        for shown, parsed, outcomes in (("", "parsed", "outcomes"),
                                         (", each shown a lesson", "parsed_with_lesson", "outcomes_with_lesson")):
            log.info("warm start: the extractor's distillations of %d fresh episodes%s: %.0f%% parse (%s)",
                     probe["episodes"], shown, 100 * probe[parsed],
                     ", ".join(f"{k} {v}" for k, v in sorted(probe[outcomes].items())))
        log.info("warm start: the extractor's merges of %d chunks of lessons: %.0f%% parse (%s)",
                 probe["merges"], 100 * probe["merge_parsed"],
                 ", ".join(f"{k} {v}" for k, v in sorted(probe["merge_outcomes"].items())))
        worst = min(probe["parsed"], probe["parsed_with_lesson"])
        if worst < PROBE_WARN_BELOW:
            log.warning("warm start: only %.0f%% of the extractor's distillations parse, so the bank "
                        "will stay nearly empty; raise warm_start.extractor_steps", 100 * worst)
    return params, {"extractor": summary, "time_s": time.perf_counter() - started}


def warm_start_states(cfg: RunConfig, workdir: str, tokenizer, train_tasks: list[dict], mesh,
                      extractor_mesh, actor_state: TrainState, extractor_state: TrainState,
                      with_extractor: bool, generate: Generate | None = None,
                      stop_signal: Callable[[], int] | None = None, cache_from: tuple[str, ...] = ()):
    """A run's warm start (`run_warm_start` with the inputs its config gives): (actor state,
    extractor state, summary), the states holding the warmed-up params. The extractor is
    fine-tuned only `with_extractor` (a run with a bank)."""
    inputs = WarmStartInputs(
        tokenizer=tokenizer, mesh=mesh, actor_state=actor_state,
        extractor_state=extractor_state if with_extractor else None,
        train_tasks=train_tasks, max_turns=cfg.rollout.max_turns, actor_max_len=cfg.rl.max_seq_len,
        extractor_room=cfg.extractor.cache_length - cfg.extractor.max_new_tokens,
        extractor_max_len=cfg.extractor.cache_length, seed=cfg.seed, identity=cache_identity(cfg),
        extractor_mesh=extractor_mesh, generate=generate, stop_signal=stop_signal,
        cache_from=tuple(cache_from))
    actor_params, extractor_params, summary = run_warm_start(cfg.warm_start, inputs, workdir)
    actor_state = actor_state.replace(params=actor_params)
    if extractor_params is not None:
        extractor_state = extractor_state.replace(params=extractor_params)
    return actor_state, extractor_state, summary


def summary_metrics(summary: dict) -> dict[str, float]:
    """The warm start's summary as the metrics logged with the first RL step."""
    out = {"warm_start/actor_loss": summary["actor"]["loss_last"] or 0.0,
           "warm_start/demo_success": summary["demos"]["success"],
           "warm_start/time_s": summary.get("time_s", 0.0)}
    if summary.get("actor_fingerprint") is not None:  # which actor RL starts from
        out["warm_start/actor_fingerprint"] = summary["actor_fingerprint"]
    if "actor_window" in summary:
        out["warm_start/actor_window_loss"] = summary["actor_window"]["loss_last"] or 0.0
    if "extractor" in summary:
        out["warm_start/extractor_loss"] = summary["extractor"]["loss_last"] or 0.0
        if "probe" in summary["extractor"]:  # absent from caches made before the probe
            probe = summary["extractor"]["probe"]
            out["warm_start/extractor_parsed"] = probe["parsed"]
            if "parsed_with_lesson" in probe:  # absent from caches made before it was probed
                out["warm_start/extractor_parsed_with_lesson"] = probe["parsed_with_lesson"]
            if "merge_parsed" in probe:   # absent from caches made before the merge probe
                out["warm_start/extractor_merge_parsed"] = probe["merge_parsed"]
    return out
