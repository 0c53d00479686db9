"""Typed, validated run configuration: the boundary between ConfigDict files and the library.

Experiment files (`experiments/configs/*.py`) return an `ml_collections.ConfigDict`; `from_dict`
turns it into the frozen dataclasses below and checks every value before any compute. Every problem
becomes one line of a `ConfigError`; nothing below the trainer reads a ConfigDict.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any


class ConfigError(ValueError):
    """A bad configuration; `problems` holds one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid config:\n  " + "\n  ".join(problems))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    preset: str = "tiny"        # a crl_jax.models preset, used when `path` is empty
    path: str = ""              # a local Hugging Face folder; "smollm2" = the packaged GGUF model
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: str = "none"


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    groups_per_step: int = 4    # tasks per step; each task is one GRPO group
    group_size: int = 8         # K rollouts per task (paper: 8)
    free_per_group: int = 4     # experience-free rollouts per group; the rest are guided
    max_turns: int = 0          # 0 = the environment's own limit
    max_new_tokens: int = 48    # per actor turn
    cache_length: int = 1024    # KV slots per episode (prompt + all turns)
    temperature: float = 0.99
    top_p: float = 0.99
    top_k: int = 100
    search_and_ask: bool = True
    max_tool_uses: int = 2
    step_timeout_s: float = 30.0


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
    enabled: bool = True        # False = the GRPO baseline: no retrieval, no extractor at all
    capacity: int = 20_000
    merge_every: int = 5        # 0 = never merge (ablation)
    merge_chunk: int = 5
    warmup_steps: int = 5       # steps that only build the bank
    embedder: str = "minilm"
    diversity_lambda: float = 0.4
    candidate_multiplier: int = 16
    recency_steps: int = 1
    demote_probability: float = 0.5


@dataclasses.dataclass(frozen=True)
class ExtractorConfig:
    train: bool = True          # False = static online experience
    batch_size: int = 64        # |B_phi|
    cooldown_steps: int = 1
    weight_power: float = 0.5
    max_new_tokens: int = 96
    cache_length: int = 2048
    temperature: float = 1.0
    top_p: float = 0.99


@dataclasses.dataclass(frozen=True)
class RLConfig:
    train_actor: bool = True    # False = experience only (actor frozen)
    advantage_normalization: str = "mean_std"
    advantage_split: str = "subgroup"
    clip_eps: float = 0.2
    cispo_eps: float = 0.1
    aggregation: str = "seq_mean_token_mean"
    learning_rate: float = 1e-6
    extractor_learning_rate: float = 1e-6
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    micro_batches: int = 1
    old_logprobs: str = "recompute"
    max_seq_len: int = 1024
    # True: every update carries an extractor batch of one shape (extractor.batch_size x
    # extractor.cache_length; an empty one, which changes nothing, on steps without samples), so
    # the joint step compiles once per actor length bucket rather than once per pair of actor
    # bucket and extractor shape or none. For small extractors, whose padded update costs less
    # than the compiles it saves (the CPU configs).
    fixed_extractor_batch: bool = False
    # > 0: the LM head and its log-softmax run only at the trained tokens, up to this many per
    # micro-batch (more: every position, so none is dropped). RL rows are long prompts and
    # multi-turn context around few response tokens, so most of the head's work is never read.
    logprob_positions: int = 0


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    every: int = 10             # steps; 0 = never (a final evaluation still runs)
    tasks_per_env: int = 16
    at_start: bool = False      # also evaluate before the first RL step (after any warm start)
    with_experience: bool = True
    without_experience: bool = True


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    """Behaviour cloning of the actor and SFT of the extractor before RL (see crl_jax.warm_start);
    for models that start from random weights. Cached in <workdir>/warm_start."""
    enabled: bool = False
    episodes: int = 256         # scripted train-split episodes for behaviour cloning
    epsilons: tuple[float, ...] = (0.0, 0.25, 0.5)  # random-action rates, cycled over the episodes
    guided_fraction: float = 0.5   # episodes with a lesson in the system prompt
    search_fraction: float = 0.2   # guided episodes that open with a search-and-ask call
    actor_steps: int = 200         # behaviour-cloning steps on whole episodes
    # A first cloning phase on windows: the last `actor_window` tokens before each action, that
    # action alone trained (0 = no such phase). See warm_start.demos.action_windows.
    actor_window: int = 0
    window_steps: int = 0
    window_batch_size: int = 32
    # Precede each window with its episode's goal message, at its true distance (the windows then
    # vary in length, and a batch holds window_batch_size * actor_window tokens).
    window_goal: bool = False
    extractor_steps: int = 100
    merge_examples: int = 32
    # Lessons per merge example: 2 to this many, drawn per example (the run's merges show up to
    # memory.merge_chunk entries plus the items carried from the previous chunk).
    merge_lessons: int = 4
    batch_size: int = 16
    learning_rate: float = 1e-3
    extractor_learning_rate: float = 1e-3


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every: int = 5
    keep: int = 3


@dataclasses.dataclass(frozen=True)
class RunConfig:
    tasks: tuple[str, ...] = ("minihack/room-ultimate-5x5",)
    steps: int = 20
    seed: int = 0
    actor: ModelConfig = ModelConfig()
    extractor_model: ModelConfig = ModelConfig()
    tokenizer: str = "word"     # "word" = built from the environments' texts, else a folder
    rollout: RolloutConfig = RolloutConfig()
    memory: MemoryConfig = MemoryConfig()
    extractor: ExtractorConfig = ExtractorConfig()
    rl: RLConfig = RLConfig()
    eval: EvalConfig = EvalConfig()
    warm_start: WarmStartConfig = WarmStartConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    mesh_shape: tuple[int, ...] = (1, -1, 1)
    # Role meshes: 0 = actor and extractor colocated on the one mesh above; n > 0 = the last n
    # devices form the extractor's own mesh (shape `extractor_mesh_shape`), the rest the actor's.
    extractor_devices: int = 0
    extractor_mesh_shape: tuple[int, ...] = (1, -1, 1)
    data_dir: str = ""          # TFDS data dir; empty = <workdir>/tfds
    log_every: int = 1


_CHOICES = {
    "dtype": ("float32", "bfloat16"), "param_dtype": ("float32", "bfloat16"),
    "remat": ("none", "full", "dots", "dots_no_batch"),
    "advantage_normalization": ("mean_std", "mean"),
    "advantage_split": ("subgroup", "group", "batch"),
    "aggregation": ("seq_mean_token_mean", "token_mean"),
    "old_logprobs": ("sampler", "recompute"),
}
_POSITIVE = {"steps", "groups_per_step", "group_size", "max_new_tokens", "cache_length", "capacity",
             "merge_chunk", "batch_size", "max_seq_len", "micro_batches", "tasks_per_env", "keep",
             "log_every", "candidate_multiplier", "episodes"}
_NON_NEGATIVE = {"seed", "free_per_group", "max_turns", "max_tool_uses", "merge_every", "warmup_steps",
                 "cooldown_steps", "weight_power", "weight_decay", "every", "recency_steps",
                 "diversity_lambda", "learning_rate", "extractor_learning_rate", "clip_eps", "cispo_eps",
                 "actor_steps", "extractor_steps", "merge_examples", "extractor_devices",
                 "logprob_positions"}


def _check_value(path: str, name: str, value: Any, problems: list[str]) -> None:
    if name in _CHOICES and value not in _CHOICES[name]:
        problems.append(f"{path}: must be one of {', '.join(_CHOICES[name])}; got {value!r}")
    if name in _POSITIVE and not value > 0:
        problems.append(f"{path}: must be > 0; got {value!r}")
    if name in _NON_NEGATIVE and not value >= 0:
        problems.append(f"{path}: must be >= 0; got {value!r}")


def _build(cls, data: Any, path: str, problems: list[str]):
    if data is None:
        return cls()
    if not isinstance(data, dict):
        problems.append(f"{path}: expected a section of settings, got {type(data).__name__}")
        return cls()
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in fields:
            problems.append(f"{path + '.' if path else ''}{key}: unknown setting "
                            f"(known: {', '.join(sorted(fields))})")
    values = {}
    for name, field in fields.items():
        if name not in data:
            continue
        key_path = f"{path + '.' if path else ''}{name}"
        hint, value = hints[name], data[name]
        if dataclasses.is_dataclass(hint):
            values[name] = _build(hint, value, key_path, problems)
            continue
        converted = _convert(hint, value)
        if converted is _INVALID:
            problems.append(f"{key_path}: expected {_type_name(hint)}, got {value!r}")
            continue
        _check_value(key_path, name, converted, problems)
        values[name] = converted
    return cls(**values)


_INVALID = object()


def _type_name(hint) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _convert(hint, value):
    origin = typing.get_origin(hint)
    if origin is tuple:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            return _INVALID
        item = typing.get_args(hint)[0]
        items = [_convert(item, v) for v in value]
        return _INVALID if any(i is _INVALID for i in items) else tuple(items)
    if hint is bool:
        return value if isinstance(value, bool) else _INVALID
    if hint is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _INVALID
    if hint is float:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else _INVALID
    if hint is str:
        return value if isinstance(value, str) else _INVALID
    return value


def from_dict(data: dict) -> RunConfig:
    """Validate a plain dict (e.g. `config_dict.to_dict()`) into a RunConfig; ConfigError lists all
    problems, one line each."""
    problems: list[str] = []
    cfg = _build(RunConfig, data, "", problems)
    if not problems:
        problems += _cross_checks(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def _cross_checks(cfg: RunConfig) -> list[str]:
    from crl_jax import envs

    problems = []
    known = set(envs.list_envs())
    for task in cfg.tasks:
        if task not in known:
            problems.append(f"tasks: unknown environment {task!r} (known: {', '.join(sorted(known))})")
    if not cfg.tasks:
        problems.append("tasks: at least one environment is required")
    r = cfg.rollout
    if r.free_per_group > r.group_size:
        problems.append(f"rollout.free_per_group: {r.free_per_group} exceeds group_size {r.group_size}")
    if r.max_new_tokens >= r.cache_length:
        problems.append(f"rollout.max_new_tokens: {r.max_new_tokens} must be < cache_length {r.cache_length}")
    if not 0 < r.temperature:
        problems.append(f"rollout.temperature: must be > 0; got {r.temperature}")
    if not 0 < r.top_p <= 1:
        problems.append(f"rollout.top_p: must be in (0, 1]; got {r.top_p}")
    if (r.groups_per_step * r.group_size) % cfg.rl.micro_batches:
        problems.append(f"rl.micro_batches: {cfg.rl.micro_batches} does not divide the actor batch "
                        f"{r.groups_per_step * r.group_size}")
    if cfg.extractor.max_new_tokens >= cfg.extractor.cache_length:
        problems.append("extractor.max_new_tokens: must be < extractor.cache_length")
    if len(cfg.mesh_shape) != 3 or cfg.mesh_shape.count(-1) > 1:
        problems.append("mesh_shape: three axes (data, fsdp, tensor) with at most one -1; "
                        f"got {cfg.mesh_shape}")
    if len(cfg.extractor_mesh_shape) != 3 or cfg.extractor_mesh_shape.count(-1) > 1:
        problems.append("extractor_mesh_shape: three axes (data, fsdp, tensor) with at most one -1; "
                        f"got {cfg.extractor_mesh_shape}")
    import os

    for name, model in (("actor", cfg.actor), ("extractor_model", cfg.extractor_model)):
        if model.path and model.path != "smollm2" and not os.path.isdir(model.path):
            problems.append(f"{name}.path: {model.path!r} is not a checkpoint folder")
    if cfg.memory.embedder != "minilm" and not os.path.isdir(cfg.memory.embedder):
        problems.append(f"memory.embedder: 'minilm' or a Qwen3-Embedding folder; {cfg.memory.embedder!r} "
                        "is not a folder")
    if cfg.tokenizer not in ("word", "actor") and not os.path.isdir(cfg.tokenizer):
        problems.append(f"tokenizer: 'word', 'actor' or a tokenizer folder; got {cfg.tokenizer!r}")
    if cfg.tokenizer == "actor" and not cfg.actor.path:
        problems.append("tokenizer: 'actor' needs actor.path (a checkpoint folder or 'smollm2')")
    problems += _warm_start_problems(cfg.warm_start)
    if not 0 <= cfg.memory.demote_probability <= 1:
        problems.append(f"memory.demote_probability: must be in [0, 1]; got {cfg.memory.demote_probability}")
    return problems


def _warm_start_problems(w: WarmStartConfig) -> list[str]:
    problems = []
    for name in ("guided_fraction", "search_fraction"):
        if not 0 <= getattr(w, name) <= 1:
            problems.append(f"warm_start.{name}: must be in [0, 1]; got {getattr(w, name)}")
    if not w.epsilons or any(not 0 <= e <= 1 for e in w.epsilons):
        problems.append(f"warm_start.epsilons: one or more values in [0, 1]; got {w.epsilons}")
    for name in ("actor_window", "window_steps", "window_batch_size", "actor_steps", "extractor_steps"):
        if getattr(w, name) < 0:
            problems.append(f"warm_start.{name}: must be >= 0; got {getattr(w, name)}")
    if w.merge_lessons < 2:
        problems.append(f"warm_start.merge_lessons: a merge example needs >= 2 lessons; got {w.merge_lessons}")
    if w.window_steps > 0 and not (w.actor_window > 0 and w.window_batch_size > 0):
        problems.append("warm_start.window_steps > 0 needs actor_window > 0 and window_batch_size > 0; "
                        f"got actor_window={w.actor_window}, window_batch_size={w.window_batch_size}")
    for name in ("learning_rate", "extractor_learning_rate"):
        if w.enabled and not getattr(w, name) > 0:
            problems.append(f"warm_start.{name}: must be > 0; got {getattr(w, name)}")
    return problems


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


__all__ = ["ConfigError", "RunConfig", "from_dict", "to_dict"]
