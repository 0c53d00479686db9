"""The trainer tests' tiny run with a warm start and evaluations (nano models, the corridor
environment, registered here so that `experiments/run.py --config=<this file>` knows it)."""

from ml_collections import config_dict

from crl_jax import envs
from tests.trainer.tiny_config import tiny_run

envs.register("test/corridor", "tests.corridor_env", "CorridorEnv")

WARM = {
    "tasks": ("test/corridor",),
    "rollout": {"max_turns": 4, "max_new_tokens": 6},
    "warm_start": {"enabled": True, "episodes": 16, "actor_steps": 6, "extractor_steps": 2,
                   "merge_examples": 2, "batch_size": 4, "learning_rate": 3e-3},
    "eval": {"every": 0, "tasks_per_env": 4, "at_start": True},
    "extractor": {"batch_size": 2, "max_new_tokens": 16, "cache_length": 256},
    "rl": {"max_seq_len": 256},
}


def get_config(arg=None):
    return config_dict.ConfigDict(tiny_run(**WARM, steps=int(arg) if arg else 2))
