"""The trainer tests' tiny run with the experiment variants, for `experiments/reproduce.py` tests:
`--config=<this file>:baseline` is the tiny run made into the GRPO baseline, exactly as
`single_task.py:baseline` makes the default one (one step unless `--config.steps` says more)."""

import os
import sys

from ml_collections import config_dict

from tests.trainer.tiny_config import tiny_run

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(_ROOT, "experiments", "configs"))
import single_task  # noqa: E402


def get_config(arg=None):
    c = config_dict.ConfigDict(tiny_run(steps=1))
    for variant in filter(None, (arg or "").split(",")):
        single_task.apply_variant(c, variant.strip())
    return c
