"""Entry point: `python experiments/run.py --config=single_task.py [--config.key=value ...]`.

`--config` takes a config file (a bare name resolves against experiments/configs/), optionally
with a variant after a colon (`single_task.py:baseline`); `--config.section.key=value` overrides
any setting; `--workdir` chooses where checkpoints, logs and the report go. A run restarted with
the same workdir resumes from its newest valid checkpoint.

Multi-host: set CRL_JAX_DISTRIBUTED=1 (launch_tpu.sh does) to call jax.distributed.initialize().
"""

import os
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
sys.path.insert(0, os.path.dirname(_CONFIG_DIR))


def _resolve_config_argument(argv: list[str]) -> list[str]:
    """Let `--config=single_task.py[:variant]` name a file in experiments/configs/."""
    out = []
    for arg in argv:
        if arg.startswith("--config="):
            value = arg[len("--config="):]
            path, sep, variant = value.partition(":")
            if not os.path.exists(path) and os.path.exists(os.path.join(_CONFIG_DIR, path)):
                arg = f"--config={os.path.join(_CONFIG_DIR, path)}{sep}{variant}"
        out.append(arg)
    return out


_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(_CONFIG_DIR, "single_task.py"), "Experiment config file.",
    lock_config=True)
flags.DEFINE_string("workdir", "workdir", "Where checkpoints, logs and the report go.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    from crl_jax.config import ConfigError, from_dict

    try:
        cfg = from_dict(_CONFIG.value.to_dict())
    except ConfigError as err:
        for problem in err.problems:
            print(f"config error: {problem}", file=sys.stderr)
        sys.exit(2)
    if os.environ.get("CRL_JAX_DISTRIBUTED") == "1":
        import jax

        jax.distributed.initialize()
    from crl_jax import trainer

    trainer.main(cfg, FLAGS.workdir)


if __name__ == "__main__":
    sys.argv = _resolve_config_argument(sys.argv)
    app.run(main)
