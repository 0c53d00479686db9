"""Wiring of a Complementary RL run: meshes, models, samplers, the bank, the loop, checkpoints.

One step (see the paper's co-evolution schedule):
  1. join the previous step's distillation (rollout/distillation.py); merge the bank every
     `memory.merge_every` steps;
  2. draw `groups_per_step` tasks; per task K rollouts with the same seed, the first
     `free_per_group` experience-free and the rest experience-guided (top-1 retrieved entry in the
     system prompt from the end of warm-up on, search-and-ask available): rollout/collect.py;
  3. credit each used extractor generation with the episode outcome (+1/-1) in B_phi, and draw
     the extractor's Eq. 7-weighted batch once B_phi holds one: rollout/credit.py;
  4. after warm-up: one joint train step (rl/updater.py), while this step's guided episodes are
     distilled in the background (in the foreground when the extractor is being updated);
  5. log, evaluate every `eval.every` steps (run/evaluation.py), checkpoint every
     `checkpoint.every` steps, and after a SIGTERM / SIGINT (graceful_stop): checkpoint this step
     and stop (before the first step: after the warm-start half or start evaluation in progress).
All randomness is derived from (seed, step), so a resumed run repeats an uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import os
import time

import jax
import jax.numpy as jnp

from crl_jax import roles
from crl_jax.config import RunConfig, to_dict
from crl_jax.data import task_specs
from crl_jax.models import bert
from crl_jax.rl.updater import Updater
from crl_jax.rollout.collect import RolloutCollector
from crl_jax.rollout.credit import ExtractorCredit
from crl_jax.rollout.distillation import DistillationQueue
from crl_jax.rollout.task_stream import TaskStream
from crl_jax.rollout.trajectory import EpisodeSpec, generations_batch, group_specs
from crl_jax.run import build, distributed, episodes, graceful_stop, host_memory, workdir_lock
from crl_jax.run import metrics as metrics_lib
from crl_jax.run.checkpoint import Checkpointer
from crl_jax.run.evaluation import Evaluator, episode_seed
from crl_jax.warm_start import summary_metrics, warm_start_states

log = logging.getLogger("crl_jax")


class Trainer:
    def __init__(self, cfg: RunConfig, workdir: str, cache_from: tuple[str, ...] = ()):
        """`cache_from`: sibling runs' workdirs whose warm start and start evaluation this run
        may take where its own workdir has none (each used only under a matching digest)."""
        self.cfg, self.workdir, self.cache_from = cfg, workdir, tuple(cache_from)
        if cfg.memory.enabled and cfg.memory.embedder == "minilm":
            bert.packaged_minilm_path()  # a missing package fails before the workdir is made
        os.makedirs(workdir, exist_ok=True)
        if jax.process_index() == 0:  # before anything in the workdir is read or written
            workdir_lock.acquire(workdir)
        self.mesh, self.extractor_mesh = roles.role_meshes(cfg.mesh_shape, cfg.extractor_devices,
                                                           cfg.extractor_mesh_shape)
        # Multi-host: states train on the global mesh; samplers and the bank use host-local devices.
        self.hosts = distributed.Hosts.create(self.mesh)
        self.rollout_mesh = self.hosts.local_mesh if self.hosts else self.mesh
        self.tokenizer, self.actor_state, self.extractor_state = build.build_states(
            cfg, workdir, self.mesh, self.extractor_mesh)
        self.train_cfg = build.train_config(cfg)
        ext_cfg = cfg.extractor
        fixed_extractor_batch = cfg.rl.fixed_extractor_batch and cfg.memory.enabled and ext_cfg.train
        empty_extractor_batch = generations_batch(
            [], ext_cfg.cache_length, ext_cfg.batch_size, self.tokenizer.pad_id
        ) if fixed_extractor_batch else None
        self.updater = Updater(self.train_cfg, self.mesh, self.extractor_mesh, cfg.rl.max_seq_len,
                               self.hosts, empty_extractor_batch)
        self.actor_loop = build.build_actor_loop(cfg, self.actor_state, self.tokenizer, self.rollout_mesh)
        self.experience = None
        if cfg.memory.enabled:
            self.experience = build.build_experience(
                cfg, self.extractor_state, self.tokenizer, self.rollout_mesh,
                self.rollout_mesh if self.hosts else self.extractor_mesh, self.hosts)
        self.collector = RolloutCollector(self.actor_loop, self.experience, cfg.rollout.step_timeout_s,
                                          self.hosts)
        self.credit = ExtractorCredit.from_config(
            cfg.extractor, self.tokenizer.pad_id,
            fixed_length=self.hosts is not None or fixed_extractor_batch)
        self.distillation = DistillationQueue(self.experience, self.credit, inline=self.hosts is not None)
        self._carry: dict = {}  # counts of a distillation joined by a checkpoint, for the next row

        per_env = cfg.eval.tasks_per_env
        splits = distributed.process0_first(
            lambda: task_specs(cfg.tasks, cfg.data_dir or os.path.join(workdir, "tfds"), min_test=per_env,
                               test_per_env=per_env), "task_splits")
        self.train_tasks = splits["train"]
        self.stream = TaskStream(splits["train"], cfg.seed)
        self.evaluator = Evaluator(cfg, splits["test"], self._play_evaluation, self.experience is not None,
                                   workdir, self.hosts, self.cache_from)
        self.checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"),
                                         max_to_keep=cfg.checkpoint.keep, digest=build.run_digest(cfg))

    # ---- one training step -----------------------------------------------------------------
    def rollout(self, specs: list[EpisodeSpec], step: int, use_memory: bool, seed: int,
                allow_tools: bool = True, count_retrievals: bool = True):
        """(trajectories, injected entries) of `specs` under the current params."""
        return self.collector.collect(self.actor_state.params, self.extractor_state.params, specs, step,
                                      use_memory, seed, allow_tools, count_retrievals)

    def _play_evaluation(self, specs, step: int, use_memory: bool, seed: int):
        return self.rollout(specs, step, use_memory, seed, count_retrievals=False)[0]

    def train_step(self, step: int, tasks: list[dict]) -> dict:
        cfg, experience = self.cfg, self.experience
        started = time.perf_counter()
        metrics: dict[str, float] = {}
        metrics_lib.add_counts(metrics, "distill", {**self._carry, **self.distillation.join()})
        self._carry = {}
        warm = experience is not None and step < cfg.memory.warmup_steps
        if experience is not None and cfg.memory.merge_every and step > 0:
            merged = experience.merge(self.extractor_state.params, step)
            if merged["calls"]:
                metrics.update({f"bank/merge_{k}": float(v) for k, v in merged.items()})
        # Extractor work on the critical path: waiting for last step's distillation, merging,
        # and (below) distilling in the foreground.
        extractor_s = time.perf_counter() - started

        use_memory = experience is not None and not warm
        counts = metrics_lib.retrieval_counts
        before = counts(experience.stats) if experience is not None else {}
        r = cfg.rollout
        specs = group_specs(tasks, r.group_size, r.free_per_group if experience is not None else r.group_size)
        trajectories, entries = self.rollout(specs, step, use_memory, seed=episode_seed(cfg.seed, step, 0))
        if experience is not None:
            metrics.update({k: float(n - before[k]) for k, n in counts(experience.stats).items()})
        metrics[metrics_lib.TIME_ACTOR_ROLLOUT] = self.actor_loop.last_timings["actor_rollout_s"]
        metrics.update(episodes.step_episode_metrics(trajectories))
        self.last_samples = episodes.sample_episodes(trajectories)

        extractor_batch = None
        if use_memory:
            self.credit.credit(trajectories, entries)
            if cfg.extractor.train:
                extractor_batch = self.credit.batch(experience.manager, step, metrics)
        # Distillation in the foreground adds to the counts of last step's background one. In the
        # background it reads the extractor's weights while the update runs, and an update with
        # the empty extractor batch donates them (unchanged): it then reads a copy.
        params = self.extractor_state.params
        updates = not warm and (cfg.rl.train_actor or extractor_batch is not None)
        if updates and extractor_batch is None and self.updater.fills_missing_extractor_batch:
            params = jax.tree.map(jnp.copy, params)
        distilled, seconds = self.distillation.submit(params, trajectories, entries, step,
                                                      in_background=extractor_batch is None)
        metrics_lib.add_counts(metrics, "distill", distilled)
        extractor_s += seconds
        metrics[metrics_lib.TIME_EXTRACTOR] = extractor_s

        if updates:
            update_started = time.perf_counter()
            self.actor_state, self.extractor_state, update = self.updater(
                self.actor_state, self.extractor_state, trajectories, extractor_batch)
            metrics.update(update)
            # Includes the extractor's update when it shares the step, and any compilation.
            metrics[metrics_lib.TIME_ACTOR_UPDATE] = time.perf_counter() - update_started
        if experience is not None:
            metrics.update(experience.bank_metrics(step))
        metrics["extractor/buffer_size"] = float(len(self.credit.buffer))
        metrics[metrics_lib.TIME_STEP] = time.perf_counter() - started
        metrics.update(metrics_lib.host_memory_metrics(host_memory.usage()))
        return metrics

    # ---- checkpoints -----------------------------------------------------------------------
    def host_state(self, next_step: int) -> dict:
        state = {"next_step": next_step, **self.credit.state(), "carry": self._carry,
                 "stream": self.stream.state()}
        if self.experience is not None:
            state.update(self.experience.host_state())
        return state

    def device_state(self) -> dict:
        tree = {"actor": self.actor_state, "extractor": self.extractor_state}
        if self.experience is not None:
            tree["bank"] = self.experience.manager.bank
            if self.hosts:  # one replicated copy in the checkpoint
                tree["bank"] = self.hosts.to_global(tree["bank"])
        return tree

    def save(self, next_step: int) -> None:
        # Finish background work before the checkpoint; its metrics go into the next step's row.
        self._carry.update(self.distillation.join())
        self.checkpointer.save(next_step, self.device_state(), self.host_state(next_step))

    def restore(self) -> int:
        """Restore the newest valid checkpoint of this workdir; returns the step to run next."""
        if self.checkpointer.latest_step() is None:
            return 0
        step, _, host = self.checkpointer.restore(self.device_state(), accept=self._take_restored)
        for skipped, why in sorted(self.checkpointer.skipped.items()):
            log.warning("checkpoint step %d was unusable (%s); restored step %d instead", skipped, why, step)
        log.info("restored checkpoint of step %d from %s", step, self.checkpointer.directory)
        return int(host["next_step"])

    def _take_restored(self, tree: dict, host: dict) -> None:
        """Adopt a restored step, or raise (the checkpointer then tries an older one)."""
        if self.experience is not None:
            bank = tree["bank"]
            if self.hosts:
                bank = self.hosts.to_local(bank, self.experience.manager.bank)
            self.experience.restore(bank, host)
        self.credit.restore(host)
        self.stream.restore(host["stream"])
        self._carry = dict(host["carry"])
        self.actor_state, self.extractor_state = tree["actor"], tree["extractor"]

    def check_update_fits(self) -> None:
        """Stop an oversized run here, not at its first update after the warm start."""
        r, e = self.cfg.rollout, self.cfg.extractor
        self.updater.check_fits(self.actor_state, self.extractor_state, r.groups_per_step * r.group_size,
                                self.cfg.rl.micro_batches, (e.batch_size, e.cache_length)
                                if self.experience is not None and e.train else None)

    # ---- the loop --------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        self.check_update_fits()
        start = self.restore()
        writer = metrics_lib.MetricsWriter(self.workdir)
        writer.resume_from(start - 1)
        samples = episodes.SamplesLog(self.workdir, start, writes=jax.process_index() == 0)
        progress = metrics_lib.Progress(cfg.steps, keys=(metrics_lib.TRAIN_SUCCESS, metrics_lib.BANK_SIZE,
                                                         metrics_lib.TIME_STEP), every=cfg.log_every)
        last: dict = {}
        stopped: graceful_stop.Stopped | None = None
        # A SIGTERM / SIGINT ends the run at the next point where nothing finished is lost: before
        # RL after the warm-start half or the start evaluation it arrives in (both kept in the
        # workdir), during RL after the step it arrives in, checkpointed.
        with graceful_stop.StopRequests() as stop:
            try:
                before_rl = self.before_rl(stop) if start == 0 else {}
                for step in range(start, cfg.steps):
                    last = self._run_step(step, before_rl, writer, samples, progress)
                    before_rl = {}
                    stopping = graceful_stop.agreed_signal(stop, self.hosts)
                    if (step + 1) % cfg.checkpoint.every == 0 or step + 1 == cfg.steps or stopping:
                        self.save(step + 1)
                    if stopping and step + 1 < cfg.steps:
                        raise graceful_stop.Stopped(stopping, step + 1)
            except graceful_stop.Stopped as stop_request:
                stopped = stop_request
        progress.close()
        self.distillation.join()
        self.checkpointer.wait()
        writer.close()
        if jax.process_index() == 0:
            if stopped is None:  # a stopped run is not finished: no report
                from crl_jax.run import report

                report.write_report(self.workdir)
            workdir_lock.release(self.workdir)
        if stopped is not None:
            raise stopped
        return last

    def _run_step(self, step: int, before_rl: dict, writer, samples, progress) -> dict:
        """One RL step with its evaluation (if due), logged; returns its metrics."""
        cfg = self.cfg
        metrics = {**before_rl, **self.train_step(step, self.stream.take(cfg.rollout.groups_per_step))}
        if (cfg.eval.every and (step + 1) % cfg.eval.every == 0) or step + 1 == cfg.steps:
            # The evaluation with experience reads the bank: this step's distillation finishes
            # first, so what it sees does not depend on timing, and its counts (on the last
            # step the run's final pass) are logged in this step's row.
            metrics_lib.add_counts(metrics, "distill", self.distillation.join())
            metrics.update(self.evaluator.evaluate(step))
        writer.write(step, metrics)
        # Extractor outputs are taken on every host, so none accumulates them.
        samples.append(step, self.last_samples,
                       self.experience.take_output_samples() if self.experience is not None else None)
        progress.update(step + 1, metrics)
        return metrics

    # ---- before the first step -------------------------------------------------------------
    def warm_start(self, stop: graceful_stop.StopRequests | None = None) -> dict:
        """Behaviour cloning + extractor SFT (cached in the workdir); returns its summary. With
        `stop`, a stop asked for during the actor's half raises graceful_stop.Stopped after it."""
        with_extractor = self.experience is not None
        self.actor_state, self.extractor_state, summary = warm_start_states(
            self.cfg, self.workdir, self.tokenizer, self.train_tasks, self.mesh, self.extractor_mesh,
            self.actor_state, self.extractor_state, with_extractor,
            generate=self._extractor_replies if with_extractor else None,
            stop_signal=lambda: graceful_stop.agreed_signal(stop, self.hosts), cache_from=self.cache_from)
        return summary

    def _extractor_replies(self, params, conversations) -> list[str]:
        """The extractor's replies to `conversations`, sampled as in RL (the warm-start probe)."""
        return [text for text, _ in self.experience.extractor.generate(
            params, conversations, seed=self.cfg.seed + 31, kind="probe")]

    def before_rl(self, stop: graceful_stop.StopRequests | None = None) -> dict:
        """What happens once before the first RL step: the warm start, then (if configured) an
        evaluation; its metrics are logged with the first step as "start/<key>". With `stop`, a
        stop asked for meanwhile raises graceful_stop.Stopped(signum, 0) after the warm-start
        half or the evaluation it arrives in, each kept in the workdir for the rerun."""
        out = summary_metrics(self.warm_start(stop)) if self.cfg.warm_start.enabled else {}
        graceful_stop.raise_if_stopping(stop, self.hosts)
        if self.cfg.eval.at_start:
            start = self.evaluator.start_evaluation(out)
            out.update({f"{metrics_lib.START}/{k}": v for k, v in start.items()})
            graceful_stop.raise_if_stopping(stop, self.hosts)
        return out



def main(cfg: RunConfig, workdir: str, cache_from: tuple[str, ...] = ()) -> dict:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s")
    log.setLevel(logging.INFO)  # other libraries may have configured the root logger already
    trainer = Trainer(cfg, workdir, cache_from)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(to_dict(cfg), f, indent=2)
    return trainer.run()
