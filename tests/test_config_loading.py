"""The command line through absl flags and ml_collections' config_flags: typed overrides, bare
config names, and one line per bad flag (the config file's own error, not its traceback)."""

import os
import sys

import pytest

from crl_jax.config import ConfigError
from crl_jax.run.config_loading import load_config, parse_command_line

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments",
                       "configs")


def test_overrides_take_the_type_of_their_default():
    cfg = load_config("single_task.py", ["seed=7", "tokenizer=word", "mesh_shape=(1,2,1)",
                                         "memory.demote_probability=0.5", "tasks=('sokoban/6x6-2box',)"], config_dir=CONFIGS)
    assert (cfg.seed, cfg.tokenizer, cfg.mesh_shape) == (7, "word", (1, 2, 1))
    assert cfg.memory.demote_probability == 0.5 and cfg.tasks == ("sokoban/6x6-2box",)


def test_the_run_flags_and_the_default_config(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["elsewhere", "--config.seed=99"])  # never read
    seen = {}

    def define(flag_values):
        from absl import flags
        flags.DEFINE_string("workdir", "w", "", flag_values=flag_values)
        seen["defined"] = True

    cfg, flag_values = parse_command_line(["run.py", "--workdir=out", "--config.seed=3"], CONFIGS,
                                          define_flags=define)
    assert seen and flag_values.workdir == "out" and cfg.seed == 3
    assert cfg.tasks == load_config("single_task.py", config_dir=CONFIGS).tasks


@pytest.mark.parametrize("argv, expected", [
    (["--config.rollout.group_size=abc"], "invalid literal for int()"),
    (["--config.rollout.bogus=1"], "rollout.bogus: unknown setting"),
    (["--config.nosection.x=1"], "nosection.x: unknown setting"),
    (["--config=single_task.py:nope"], "unknown variant 'nope'; known: dark"),
    (["--config=missing.py"], "config file 'missing.py' not found"),
    (["--unknown=1"], "Unknown command line flag 'unknown'"),
    (["stray"], "unexpected argument 'stray'"),
    (["--config.steps=0"], "steps: must be > 0; got 0"),
])
def test_each_bad_flag_is_one_line(argv, expected):
    with pytest.raises(ConfigError) as err:
        parse_command_line(["run.py", *argv], CONFIGS)
    assert len(err.value.problems) == 1 and "\n" not in err.value.problems[0]
    assert expected in err.value.problems[0], err.value.problems
