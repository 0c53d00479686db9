"""Task splits as TFDS datasets: deterministic train/test task specs for any registered environment.

Owns the `TaskSplits` builder and `build_task_splits` / `load_task_splits`. A task spec is
(env name, seed, goal text); train and test seeds come from disjoint ranges (train from
TRAIN_SEED_BASE, test from TEST_SEED_BASE), so a test task is never trained on. Splits are written
as array_record and read back with `as_data_source` (no TensorFlow needed), then checked against
the seeds that make them, so a damaged folder is named instead of failing deep inside TFDS.
A mixture of env names is one dataset whose examples interleave the envs round-robin.

The goal text comes from resetting the env with the seed (the only way to know it for generated
tasks); `with_goals=False` skips that and stores an empty goal, for envs whose reset is slow.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Sequence

import numpy as np
import tensorflow_datasets as tfds

from crl_jax.assets import BadModelFile
from crl_jax.envs.registry import list_envs, make

TRAIN_SEED_BASE = 0
TEST_SEED_BASE = 10_000_000  # far above any train range we build: the ranges never meet
VERSION = "1.0.0"
DEFAULT_NUM_TEST = 100  # test tasks per environment unless asked for more
REBUILD = "delete the folder and rerun: the run rebuilds it from the seeds"


def _config_name(env_names: Sequence[str], num_train: int, num_test: int, with_goals: bool) -> str:
    """A config name TFDS accepts, unique per (env names, sizes, goals)."""
    key = "|".join(env_names) + f"|{num_train}|{num_test}|{int(with_goals)}"
    stem = re.sub(r"[^a-z0-9]+", "_", "_".join(env_names).lower()).strip("_")[:60]
    return f"{stem}_{hashlib.sha1(key.encode()).hexdigest()[:8]}"


def task_seeds(split: str, num: int) -> list[int]:
    base = {"train": TRAIN_SEED_BASE, "test": TEST_SEED_BASE}.get(split)
    if base is None:
        raise ValueError(f"unknown split {split!r}; use 'train' or 'test'")
    if split == "train" and num > TEST_SEED_BASE - TRAIN_SEED_BASE:
        raise ValueError(f"at most {TEST_SEED_BASE} train tasks per env, asked for {num}")
    return list(range(base, base + num))


class TaskSplitsConfig(tfds.core.BuilderConfig):
    def __init__(self, *, env_names: Sequence[str], num_train: int, num_test: int,
                 with_goals: bool):
        unknown = [n for n in env_names if n not in list_envs()]
        if unknown:
            raise ValueError(f"unknown env names {unknown}; known: {', '.join(list_envs())}")
        if not env_names or num_train < 1 or num_test < 1:
            raise ValueError("need at least one env name, num_train >= 1 and num_test >= 1")
        super().__init__(name=_config_name(env_names, num_train, num_test, with_goals),
                         version=VERSION, description=f"task splits for {', '.join(env_names)}")
        self.env_names = tuple(env_names)
        self.num_train, self.num_test, self.with_goals = num_train, num_test, with_goals


class _GeneratedHereInfo(tfds.core.DatasetInfo):
    """The DatasetInfo of splits generated on this machine, never published. For a builder whose
    data are not yet on disk, TFDS looks for published metadata on GCS, and first makes a
    temporary directory for it that it never removes: every new build left one behind."""

    def initialize_from_bucket(self) -> None:
        return None


class TaskSplits(tfds.core.GeneratorBasedBuilder):
    """Train/test task specs (env_name, seed, goal) for one env or a mixture."""

    VERSION = tfds.core.Version(VERSION)

    def _info(self) -> tfds.core.DatasetInfo:
        return _GeneratedHereInfo(
            builder=self,
            features=tfds.features.FeaturesDict({
                "env_name": tfds.features.Text(),
                "seed": np.int64,
                "goal": tfds.features.Text(),
            }),
            # Keep the key order (seed-major, envs round-robin) instead of TFDS's hash shuffle.
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager):
        del dl_manager  # nothing is downloaded: tasks are generated from seeds
        cfg = self.builder_config
        return {"train": self._generate_examples("train", cfg.num_train),
                "test": self._generate_examples("test", cfg.num_test)}

    def _generate_examples(self, split: str, num: int):
        cfg = self.builder_config
        envs = {name: make(name) for name in cfg.env_names} if cfg.with_goals else {}
        try:
            for index, seed in enumerate(task_seeds(split, num)):
                for name in cfg.env_names:
                    goal = ""
                    if cfg.with_goals:
                        _, info = envs[name].reset(seed)
                        goal = str(info.get("goal", ""))
                    # Keys fix the order TFDS writes examples in: round-robin over envs by seed.
                    key = f"{index:09d}:{cfg.env_names.index(name):03d}"
                    yield key, {"env_name": name, "seed": seed, "goal": goal}
        finally:
            for env in envs.values():
                env.close()


def _config(env_names, num_train, num_test, with_goals) -> TaskSplitsConfig:
    if isinstance(env_names, str):
        env_names = [env_names]
    return TaskSplitsConfig(env_names=list(env_names), num_train=num_train, num_test=num_test,
                            with_goals=with_goals)


def build_task_splits(env_names: str | Sequence[str], data_dir, num_train: int = 1000,
                      num_test: int = DEFAULT_NUM_TEST, with_goals: bool = True) -> TaskSplits:
    """Generate (once) the splits for `env_names` under `data_dir`; returns the builder."""
    builder = TaskSplits(data_dir=os.fspath(data_dir),
                         config=_config(env_names, num_train, num_test, with_goals),
                         file_format="array_record")
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    return builder


def load_task_splits(env_names: str | Sequence[str], data_dir, num_train: int = 1000,
                     num_test: int = DEFAULT_NUM_TEST, with_goals: bool = True) -> dict:
    """{"train": [...], "test": [...]}: the task-spec dicts of each split, read and checked.

    Builds the splits first if they are not in `data_dir` yet. Each item is
    {"env_name": str, "seed": int, "goal": str}. Splits already on disk that cannot be read, or
    that hold other tasks than their seeds make, raise BadModelFile naming the folder and the fix.
    """
    config = _config(env_names, num_train, num_test, with_goals)
    folder = os.path.join(os.fspath(data_dir), "task_splits", config.name, VERSION)
    prepared = os.path.exists(os.path.join(folder, "dataset_info.json"))
    try:
        sources = build_task_splits(env_names, data_dir, num_train, num_test, with_goals).as_data_source()
        splits = {split: [_decoded(item) for item in sources[split]] for split in ("train", "test")}
    except Exception as err:  # any failure to read what an earlier run wrote is a damaged folder
        if not prepared:
            raise
        detail = " ".join(str(err).split())[:200]
        raise BadModelFile(f"{folder}: task splits unreadable ({type(err).__name__}: {detail}); "
                           f"{REBUILD}") from None
    for split, num in (("train", num_train), ("test", num_test)):
        items = splits[split]
        expected = [(name, seed) for seed in task_seeds(split, num)
                    for name in config.env_names]
        if [(item["env_name"], item["seed"]) for item in items] != expected:
            raise BadModelFile(f"{folder}: the {split} split holds {len(items)} tasks that are not "
                               f"the {len(expected)} its seeds make; {REBUILD}")
    return splits


def _decoded(item) -> dict:
    """A TFDS record as plain Python (str, int), not bytes/numpy."""
    text = lambda v: v.decode("utf-8") if isinstance(v, bytes) else str(v)  # noqa: E731
    return {"env_name": text(item["env_name"]), "seed": int(item["seed"]), "goal": text(item["goal"])}


def task_specs(names: Sequence[str], data_dir: str, min_test: int = 0,
               test_per_env: int | None = None) -> dict[str, list[dict]]:
    """{"train": [...], "test": [...]} task specs ({"env", "seed"}) for the environments `names`,
    as a run uses them (built into `data_dir` on first use). The test split holds
    DEFAULT_NUM_TEST tasks per environment, or `min_test` if that is more: a larger split only
    appends tasks, so its first ones are the same in every split. With `test_per_env`, "test"
    holds the first that many of each environment, environment by environment."""
    tfds.disable_progress_bar()  # the run has its own progress line
    num_test = max(DEFAULT_NUM_TEST, min_test)
    sources = load_task_splits(list(names), data_dir, num_test=num_test, with_goals=False)
    out = {split: [{"env": t["env_name"], "seed": t["seed"]} for t in sources[split]]
           for split in ("train", "test")}
    if test_per_env is not None:
        out["test"] = [t for name in names for t in [t for t in out["test"] if t["env"] == name][:test_per_env]]
    return out
