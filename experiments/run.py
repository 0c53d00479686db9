"""Entry point: `python experiments/run.py --config=single_task.py [--config.key=value ...]`.

`--config` takes a config file (a bare name resolves against experiments/configs/), optionally
with variants after a colon (`single_task.py:baseline`); `--config.section.key=value` overrides
any setting; `--workdir` chooses where checkpoints, logs and the report go; `--cache_from=DIR[,DIR]`
names sibling runs' workdirs whose finished warm start and start evaluation this run may take
where its own workdir has none (each only if built under this run's settings); `--compile_cache`
names the folder where compiled programs are kept for later runs (default under ~/.cache; empty:
off). A run restarted with the same workdir resumes from its newest valid checkpoint. A bad
config is reported one line per problem, before any training, with exit status 2; so are a
workdir another run is using and a missing packaged asset (the line names the command that
installs it) and a model or tokenizer file that cannot be read (the line names the file and what
is wrong), and a workdir none of whose checkpoints can be restored. A checkpoint that cannot be
written (a full disk) stops the run with one line and exit status 1; the previous checkpoint
stays. A SIGTERM or Ctrl-C (SIGINT) stops the run after its current RL step, checkpointed, with
status 143 / 130 (a second one stops it at once): a preempted run resumes without losing a
finished step.

Multi-host: set CRL_JAX_DISTRIBUTED=1 (launch_tpu.sh does) to call jax.distributed.initialize()
(see crl_jax/run/distributed.py; CRL_JAX_COORDINATOR, CRL_JAX_NUM_PROCESSES and CRL_JAX_PROCESS_ID
name the coordinator where it is not discovered, e.g. CPU processes on one machine).

On Linux with tcmalloc installed (`apt install libtcmalloc-minimal4`), the run first re-executes
itself with tcmalloc preloaded: XLA's CPU temporaries are then reused instead of faulted in
afresh every step (crl_jax/run/host_memory.py). CRL_JAX_MALLOC=system keeps the system's malloc.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))


def define_run_flags(flag_values) -> None:
    from absl import flags

    flags.DEFINE_string("workdir", "workdir", "where checkpoints, logs and the report go",
                        flag_values=flag_values)
    flags.DEFINE_list("cache_from", [], "sibling workdirs whose finished warm start and start "
                      "evaluation this run may take", flag_values=flag_values)
    from crl_jax.run import compile_cache

    flags.DEFINE_string("compile_cache", compile_cache.default_dir(),
                        "folder of compiled programs shared by runs on this machine (empty: off; "
                        "JAX_COMPILATION_CACHE_DIR takes precedence)", flag_values=flag_values)


def parse_command_line(argv: list[str]):
    """absl flags: `--config` (with `--config.key=value` overrides), `--workdir`, `--cache_from`,
    `--compile_cache`; returns (config, workdir, cache_from, compile_cache)."""
    from crl_jax.run import config_loading

    config_dir = os.path.join(_HERE, "configs")
    if any(a in ("-h", "--help", "--helpshort") for a in argv):
        _, flag_values = config_loading.parse_command_line(["run.py"], config_dir,
                                                           define_flags=define_run_flags)
        print(__doc__.split("\n\n")[0], flag_values.module_help(config_loading),
              flag_values.main_module_help(), sep="\n\n")
        sys.exit(0)
    cfg, flag_values = config_loading.parse_command_line(["run.py"] + argv, config_dir,
                                                         define_flags=define_run_flags)
    return cfg, flag_values.workdir, tuple(flag_values.cache_from), flag_values.compile_cache


def main(argv: list[str]) -> None:
    from crl_jax.assets import BadModelFile, MissingAsset
    from crl_jax.run.checkpoint import CheckpointError, SaveFailed
    from crl_jax.config import ConfigError
    from crl_jax.run.graceful_stop import Stopped
    from crl_jax.run.workdir_lock import WorkdirInUse

    try:
        cfg, workdir, cache_from, cache_dir = parse_command_line(argv)
        from crl_jax.run import compile_cache, distributed

        distributed.initialize_from_env()
        compile_cache.enable(cache_dir)  # before the first compile
        from crl_jax import trainer

        # The trainer raises ConfigError too, for what only the built run can tell (e.g. an
        # update that does not fit in device memory), before any training.
        trainer.main(cfg, workdir, cache_from)
    except ConfigError as err:
        for problem in err.problems:
            print(f"config error: {problem}", file=sys.stderr)
        sys.exit(2)
    except (WorkdirInUse, MissingAsset, BadModelFile, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except SaveFailed as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(1)
    except Stopped as stop:
        print(f"{workdir}: {stop}", file=sys.stderr, flush=True)
        sys.exit(128 + stop.signum)  # the status a shell gives a process the signal ended


if __name__ == "__main__":
    from crl_jax.run import host_memory

    host_memory.reexec_with_caching_malloc()  # before jax is imported; see that module
    main(sys.argv[1:])
