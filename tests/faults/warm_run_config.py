"""The trainer tests' tiny run with a warm start and evaluations (nano models, the corridor
environment, registered here so that `experiments/run.py --config=<this file>` knows it)."""

from ml_collections import config_dict

from crl_jax import envs
from tests.trainer.tiny_config import WARM, tiny_run

envs.register("test/corridor", "tests.corridor_env", "CorridorEnv")


def get_config(arg=None):
    return config_dict.ConfigDict(tiny_run(**{**WARM, "steps": int(arg) if arg else 2}))
