"""Wiring of a Complementary RL run: meshes, models, samplers, the bank, the loop, checkpoints.

One step (see the paper's co-evolution schedule):
  1. join the previous step's background distillation (its bank writes land now);
  2. merge the bank every `memory.merge_every` steps;
  3. draw `groups_per_step` tasks; per task K rollouts with the same seed, the first
     `free_per_group` experience-free and the rest experience-guided (top-1 retrieved entry in the
     system prompt from the end of warm-up on, search-and-ask available): rollout/collect.py;
  4. credit each used extractor generation with the episode outcome (+1/-1) in B_phi, and draw
     the extractor's Eq. 7-weighted batch once B_phi holds one: rollout/credit.py;
  5. after warm-up: one joint train step (actor; extractor too when it has a batch): rl/updater.py;
     the distillation of this step's guided episodes runs on a background thread meanwhile,
     except when the extractor itself is being updated (its weights are donated to the step);
  6. log, evaluate every `eval.every` steps (run/evaluation.py), checkpoint every
     `checkpoint.every` steps, and after a SIGTERM / SIGINT (graceful_stop): checkpoint this step
     and stop (before the first step: stop after the warm-start half or the start evaluation in
     progress, each kept).
All randomness is derived from (seed, step), so a resumed run repeats an uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import os
import time

import jax

from crl_jax import roles
from crl_jax.config import RunConfig, to_dict
from crl_jax.data import task_specs
from crl_jax.models import bert
from crl_jax.rl.updater import Updater
from crl_jax.rollout.collect import RolloutCollector
from crl_jax.rollout.credit import ExtractorCredit
from crl_jax.rollout.distillation import DistillationQueue
from crl_jax.rollout.task_stream import TaskStream
from crl_jax.rollout.trajectory import EpisodeSpec
from crl_jax.run import build, distributed, episodes, graceful_stop, workdir_lock
from crl_jax.run import metrics as metrics_lib
from crl_jax.run.checkpoint import Checkpointer
from crl_jax.run.evaluation import Evaluator, episode_seed
from crl_jax.warm_start import WarmStartInputs, cache_identity, run_warm_start, summary_metrics

log = logging.getLogger("crl_jax")


class Trainer:
    def __init__(self, cfg: RunConfig, workdir: str):
        self.cfg, self.workdir = cfg, workdir
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
        self.updater = Updater(self.train_cfg, self.mesh, self.extractor_mesh, cfg.rl.max_seq_len,
                               self.hosts)
        self.actor_loop = build.build_actor_loop(cfg, self.actor_state, self.tokenizer, self.rollout_mesh)
        self.experience = None
        if cfg.memory.enabled:
            self.experience = build.build_experience(
                cfg, self.extractor_state, self.tokenizer, self.rollout_mesh,
                self.rollout_mesh if self.hosts else self.extractor_mesh, self.hosts)
        self.collector = RolloutCollector(self.actor_loop, self.experience, cfg.rollout.step_timeout_s,
                                          self.hosts)
        e = cfg.extractor
        self.credit = ExtractorCredit(e.batch_size, e.cache_length, e.cooldown_steps, e.weight_power,
                                      self.tokenizer.pad_id, fixed_length=self.hosts is not None)
        self.distillation = DistillationQueue(self.experience, self.credit, inline=self.hosts is not None)
        self._carry: dict = {}  # counts of a distillation joined by a checkpoint, for the next row

        splits = distributed.process0_first(
            lambda: task_specs(cfg.tasks, cfg.data_dir or os.path.join(workdir, "tfds"),
                               min_test=cfg.eval.tasks_per_env), "task_splits")
        self.train_tasks = splits["train"]
        self.stream = TaskStream(splits["train"], cfg.seed)
        test_tasks = [t for name in cfg.tasks
                      for t in [t for t in splits["test"] if t["env"] == name][:cfg.eval.tasks_per_env]]
        self.evaluator = Evaluator(cfg, test_tasks, self._play_evaluation, self.experience is not None,
                                   workdir, self.hosts)
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

    def _episode_specs(self, tasks: list[dict]) -> list[EpisodeSpec]:
        r = self.cfg.rollout
        guided_from = r.free_per_group if self.experience is not None else r.group_size
        return [EpisodeSpec(task["env"], int(task["seed"]), group, k >= guided_from)
                for group, task in enumerate(tasks) for k in range(r.group_size)]

    def train_step(self, step: int, tasks: list[dict]) -> dict:
        cfg, experience = self.cfg, self.experience
        started = time.perf_counter()
        background = {**self._carry, **self.distillation.join()}
        self._carry = {}
        metrics: dict[str, float] = {f"distill/{k}": v for k, v in background.items()}
        warm = experience is not None and step < cfg.memory.warmup_steps
        if experience is not None and cfg.memory.merge_every and step > 0:
            merged = experience.merge(self.extractor_state.params, step)
            if merged["calls"]:
                metrics.update({f"bank/merge_{k}": float(v) for k, v in merged.items()})
        # Extractor work on the critical path: waiting for last step's distillation, merging,
        # and (below) distilling in the foreground.
        extractor_s = time.perf_counter() - started

        use_memory = experience is not None and not warm
        before = metrics_lib.retrieval_counts(experience.stats) if experience is not None else {}
        trajectories, entries = self.rollout(self._episode_specs(tasks), step, use_memory,
                                             seed=episode_seed(cfg.seed, step, 0))
        if experience is not None:
            after = metrics_lib.retrieval_counts(experience.stats)
            metrics.update({k: float(after[k] - before[k]) for k in after})
        metrics[metrics_lib.TIME_ACTOR_ROLLOUT] = self.actor_loop.last_timings["actor_rollout_s"]
        metrics.update(episodes.step_episode_metrics(trajectories))
        self.last_samples = episodes.sample_episodes(trajectories)

        extractor_batch = None
        if use_memory:
            self.credit.credit(trajectories, entries)
            if cfg.extractor.train:
                extractor_batch = self.credit.batch(experience.manager, step, metrics)
        # Distillation in the foreground adds to the counts of last step's background one.
        distilled, seconds = self.distillation.submit(self.extractor_state.params, trajectories, entries,
                                                      step, in_background=extractor_batch is None)
        for k, v in distilled.items():
            metrics[f"distill/{k}"] = metrics.get(f"distill/{k}", 0) + v
        extractor_s += seconds
        metrics[metrics_lib.TIME_EXTRACTOR] = extractor_s

        if not warm and (cfg.rl.train_actor or extractor_batch is not None):
            update_started = time.perf_counter()
            self.actor_state, self.extractor_state, update = self.updater(
                self.actor_state, self.extractor_state, trajectories, extractor_batch)
            metrics.update(update)
            # Includes the extractor's update when it shares the step, and any compilation.
            metrics[metrics_lib.TIME_ACTOR_UPDATE] = time.perf_counter() - update_started
        if experience is not None:
            metrics.update(metrics_lib.bank_metrics(experience.manager))
        metrics["extractor/buffer_size"] = float(len(self.credit.buffer))
        metrics[metrics_lib.TIME_STEP] = time.perf_counter() - started
        return metrics

    # ---- checkpoints -----------------------------------------------------------------------
    def host_state(self, next_step: int) -> dict:
        state = {"next_step": next_step, **self.credit.state(), "carry": self._carry,
                 "stream": self.stream.state()}
        if self.experience is not None:
            _, state["memory"] = self.experience.manager.state()
            state["memory_reasons"] = dict(self.experience.stats)
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
        step, tree, host = self.checkpointer.restore(self.device_state())
        for skipped, why in sorted(self.checkpointer.skipped.items()):
            log.warning("checkpoint step %d was unusable (%s); restored step %d instead", skipped, why, step)
        self.actor_state, self.extractor_state = tree["actor"], tree["extractor"]
        if self.experience is not None:
            bank = tree["bank"]
            if self.hosts:
                bank = self.hosts.to_local(bank, self.experience.manager.bank)
            self.experience.manager.restore(bank, host["memory"])
            self.experience.stats.clear()
            self.experience.stats.update(host["memory_reasons"])
        self.credit.restore(host)
        self.stream.restore(host["stream"])
        self._carry = dict(host["carry"])
        log.info("restored checkpoint of step %d from %s", step, self.checkpointer.directory)
        return int(host["next_step"])

    def check_update_fits(self) -> None:
        """Stop an oversized run here, not at its first update after the warm start."""
        r, e = self.cfg.rollout, self.cfg.extractor
        self.updater.check_fits(
            self.actor_state, self.extractor_state, r.groups_per_step * r.group_size,
            self.cfg.rl.micro_batches,
            (e.batch_size, e.cache_length) if self.experience is not None and e.train else None)

    # ---- the loop --------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        self.check_update_fits()
        start = self.restore()
        writer = metrics_lib.MetricsWriter(self.workdir)
        writer.resume_from(start - 1)
        samples_path = os.path.join(self.workdir, "samples.jsonl")
        if jax.process_index() == 0:
            episodes.keep_samples_before(samples_path, start)
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
                    last = self._run_step(step, before_rl, writer, samples_path, progress)
                    before_rl = {}
                    stopping = self._stop_signal(stop)
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

    def _stop_signal(self, stop: graceful_stop.StopRequests | None) -> int:
        """The signal that asks the run to stop after this step (0: none). Hosts agree on it, so
        all of them checkpoint the same step and stop together."""
        signum = (stop.signum or 0) if stop is not None else 0
        return max(self.hosts.allgather(signum)) if self.hosts and stop is not None else signum

    def _run_step(self, step: int, before_rl: dict, writer, samples_path: str, progress) -> dict:
        """One RL step with its evaluation (if due), logged; returns its metrics."""
        cfg = self.cfg
        metrics = {**before_rl, **self.train_step(step, self.stream.take(cfg.rollout.groups_per_step))}
        if (cfg.eval.every and (step + 1) % cfg.eval.every == 0) or step + 1 == cfg.steps:
            # The evaluation with experience reads the bank: this step's distillation finishes
            # first, so what it sees does not depend on timing, and its counts (on the last
            # step the run's final pass) are logged in this step's row.
            for k, v in self.distillation.join().items():
                metrics[f"distill/{k}"] = metrics.get(f"distill/{k}", 0) + v
            metrics.update(self.evaluator.evaluate(step))
        writer.write(step, metrics)
        sample = {"step": step, "episodes": self.last_samples}
        if self.experience is not None:  # taken on every host, so none accumulates them
            sample["extractor"] = self.experience.take_output_samples()
        if jax.process_index() == 0:
            with open(samples_path, "a") as f:
                f.write(json.dumps(sample) + "\n")
        progress.update(step + 1, metrics)
        return metrics

    # ---- before the first step -------------------------------------------------------------
    def warm_start(self, stop: graceful_stop.StopRequests | None = None) -> dict:
        """Behaviour cloning + extractor SFT (cached in the workdir); returns its summary. With
        `stop`, a stop asked for during the actor's half raises graceful_stop.Stopped after it."""
        cfg = self.cfg
        ext = self.extractor_state if self.experience is not None else None
        inputs = WarmStartInputs(
            tokenizer=self.tokenizer, mesh=self.mesh, actor_state=self.actor_state, extractor_state=ext,
            train_tasks=self.train_tasks, max_turns=cfg.rollout.max_turns,
            actor_max_len=cfg.rl.max_seq_len,
            extractor_room=cfg.extractor.cache_length - cfg.extractor.max_new_tokens,
            extractor_max_len=cfg.extractor.cache_length, seed=cfg.seed, identity=cache_identity(cfg),
            extractor_mesh=self.extractor_mesh,
            generate=self._extractor_replies if ext is not None else None,
            stop_signal=(lambda: self._stop_signal(stop)) if stop is not None else None)
        actor_params, extractor_params, summary = run_warm_start(cfg.warm_start, inputs, self.workdir)
        self.actor_state = self.actor_state.replace(params=actor_params)
        if extractor_params is not None:
            self.extractor_state = self.extractor_state.replace(params=extractor_params)
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
        self._raise_if_stopping(stop)
        if self.cfg.eval.at_start:
            start = self.evaluator.start_evaluation(out)
            out.update({f"{metrics_lib.START}/{k}": v for k, v in start.items()})
            self._raise_if_stopping(stop)
        return out

    def _raise_if_stopping(self, stop: graceful_stop.StopRequests | None) -> None:
        signum = self._stop_signal(stop)
        if signum:
            raise graceful_stop.Stopped(signum, 0)


def main(cfg: RunConfig, workdir: str) -> dict:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s")
    log.setLevel(logging.INFO)  # other libraries may have configured the root logger already
    trainer = Trainer(cfg, workdir)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(to_dict(cfg), f, indent=2)
    return trainer.run()
