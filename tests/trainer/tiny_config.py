"""The trainer tests' tiny run as a config file, for `experiments/run.py --config=<this file>`."""

from ml_collections import config_dict


def tiny_run(**sections) -> dict:
    """A run small enough for CI: nano models, 2 groups of 4 rollouts, short turns."""
    base = {
        "tasks": ("sokoban/6x6-2box",),
        "steps": 3,
        "seed": 0,
        "actor": {"preset": "nano"},
        "extractor_model": {"preset": "nano"},
        "rollout": {"groups_per_step": 2, "group_size": 4, "free_per_group": 2, "max_turns": 2,
                    "max_new_tokens": 8, "cache_length": 512, "max_tool_uses": 1},
        "memory": {"warmup_steps": 1, "merge_every": 2, "capacity": 64},
        "extractor": {"batch_size": 2, "max_new_tokens": 16, "cache_length": 512},
        "rl": {"learning_rate": 1e-2, "extractor_learning_rate": 1e-2, "max_seq_len": 512,
               "old_logprobs": "recompute"},
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


# The tiny run with a warm start and the start evaluation (the corridor environment, registered by
# the trainer tests' conftest and by tests/faults/warm_run_config.py).
WARM = {
    "tasks": ("test/corridor",), "steps": 2,
    "rollout": {"max_turns": 4, "max_new_tokens": 6},
    "warm_start": {"enabled": True, "episodes": 16, "actor_steps": 6, "extractor_steps": 2,
                   "merge_examples": 2, "batch_size": 4, "learning_rate": 3e-3},
    "eval": {"every": 0, "tasks_per_env": 4, "at_start": True},
    "extractor": {"batch_size": 2, "max_new_tokens": 16, "cache_length": 256},
    "rl": {"max_seq_len": 256},
}


def get_config(arg=None):
    return config_dict.ConfigDict(tiny_run(steps=int(arg) if arg else 3))
