"""A tiny end-to-end configuration of the whole training loop, shared by the trainer tests."""

import pytest

from crl_jax import config


def tiny_run(**sections) -> dict:
    """A run small enough for CI: nano models, household env (pure Python), 2 groups of 4."""
    base = {
        "tasks": ("household/v1",),
        "steps": 4,
        "seed": 0,
        "actor": {"preset": "nano"},
        "extractor_model": {"preset": "nano"},
        "rollout": {"groups_per_step": 2, "group_size": 4, "free_per_group": 2, "max_turns": 3,
                    "max_new_tokens": 8, "cache_length": 512, "max_tool_uses": 1},
        "memory": {"warmup_steps": 1, "merge_every": 2, "capacity": 64},
        "extractor": {"batch_size": 2, "max_new_tokens": 16, "cache_length": 1024},
        "rl": {"learning_rate": 1e-3, "extractor_learning_rate": 1e-3, "max_seq_len": 512},
        "eval": {"every": 0, "tasks_per_env": 2},
        "checkpoint": {"every": 1, "keep": 3},
        "mesh_shape": (1, -1, 1),
    }
    for name, value in sections.items():
        if isinstance(value, dict):
            base[name] = {**base.get(name, {}), **value}
        else:
            base[name] = value
    return base


@pytest.fixture
def make_config():
    def make(**sections):
        return config.from_dict(tiny_run(**sections))
    return make
