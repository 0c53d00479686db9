"""Entry point: `python experiments/run.py --config=single_task.py [--config.key=value ...]`.

The training loop (host rollouts, experience bank, joint train step, checkpoints) is assembled in
`crl_jax.trainer`; until that module exists this command says so and exits with status 2 instead
of pretending to train.
"""

import importlib.util
import os
import sys

from absl import app, flags

_HERE = os.path.dirname(os.path.abspath(__file__))
flags.DEFINE_string("config", "single_task.py", "Config file; a bare name resolves against "
                    "experiments/configs/.")
flags.DEFINE_string("workdir", "workdir", "Where checkpoints, logs and the report go.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    if importlib.util.find_spec("crl_jax.trainer") is None:
        print("crl_jax: the training loop (crl_jax.trainer) is not built yet; "
              f"nothing to run for --config={FLAGS.config}. The test suite runs with `python -m pytest`.",
              file=sys.stderr)
        sys.exit(2)
    from crl_jax import trainer

    trainer.main(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
    app.run(main)
