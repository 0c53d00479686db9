"""A tiny end-to-end configuration of the whole training loop, shared by the trainer tests.

Compilation dominates these runs, so they share JAX's persistent compilation cache (also handed to
the subprocess runs through the environment).
"""

import os

import jax
import pytest

from crl_jax import config, envs

from tests.trainer.tiny_config import tiny_run

envs.register("test/coin", "tests.trainer.coin_env", "CoinEnv")
envs.register("test/corridor", "tests.corridor_env", "CorridorEnv")


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("jax_cache"))
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


@pytest.fixture
def make_config(compile_cache):
    def make(**sections):
        return config.from_dict(tiny_run(**sections))
    return make


def subprocess_env(cache_dir: str) -> dict:
    env = dict(os.environ)
    env.update(JAX_COMPILATION_CACHE_DIR=cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0", JAX_PLATFORMS="cpu")
    return env
