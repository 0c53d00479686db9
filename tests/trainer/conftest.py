"""A tiny end-to-end configuration of the whole training loop, shared by the trainer tests.

Compilation dominates these runs, so they share JAX's persistent compilation cache (also handed to
the subprocess runs through the environment): one cache for the whole session, so that a program
one test worker compiled is loaded by the other. A size limit turns on JAX's file lock around the
cache's reads and writes, so that no process reads an entry another is still writing.
"""

import os

import jax
import pytest

from crl_jax import config, envs

from tests.trainer.tiny_config import tiny_run

envs.register("test/coin", "tests.trainer.coin_env", "CoinEnv")
envs.register("test/corridor", "tests.corridor_env", "CorridorEnv")


CACHE_MAX_BYTES = 32 << 30  # far above what the suite writes: nothing is ever evicted


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's base is a folder of the session's
        base = base.parent
    path = base / "jax_cache"
    path.mkdir(exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_compilation_cache_max_size", CACHE_MAX_BYTES)
    return str(path)


@pytest.fixture
def make_config(compile_cache):
    def make(**sections):
        return config.from_dict(tiny_run(**sections))
    return make


def subprocess_env(cache_dir: str) -> dict:
    env = dict(os.environ)
    env.update(JAX_COMPILATION_CACHE_DIR=cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0", JAX_PLATFORMS="cpu",
               JAX_COMPILATION_CACHE_MAX_SIZE=str(CACHE_MAX_BYTES))
    return env
