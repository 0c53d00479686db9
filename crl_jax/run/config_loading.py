"""Loading an experiment: a config file, a variant, and `--config.key=value` overrides.

The command line is absl flags with ml_collections' `config_flags`: `--config=file.py[:variant]`
imports the file and calls its `get_config(variant)`, `--config.section.key=value` overrides a
setting (typed by its default). A bare file name also resolves against the experiments' config
folder. `load_config("single_task.py:baseline", ["rollout.group_size=4"])` is the same parse
without a command line.

Every failure (missing file, unknown variant, unknown key, unparsable value, invalid setting)
becomes a `ConfigError` of one line per problem, so the command line prints them without a
traceback: absl reports a bad flag as a multi-line error with the config file's traceback inside.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from absl import flags
from ml_collections import config_flags

from crl_jax.config import ConfigError, RunConfig, from_dict

CONFIG_FLAG = "--config="


def parse_command_line(argv: Sequence[str], config_dir: str | None = None,
                       default_spec: str = "single_task.py",
                       define_flags: Callable[[flags.FlagValues], None] | None = None,
                       ) -> tuple[RunConfig, flags.FlagValues]:
    """Parses `argv` (argv[0] is the program): the validated config and the flags' values.

    `define_flags` adds the caller's own flags to the fresh flag set before parsing."""
    argv = list(argv)
    if not any(a.startswith(CONFIG_FLAG) for a in argv):
        argv.insert(1, CONFIG_FLAG + default_spec)
    argv = [CONFIG_FLAG + _resolve(a[len(CONFIG_FLAG):], config_dir) if a.startswith(CONFIG_FLAG)
            else a for a in argv]
    flag_values = flags.FlagValues()
    # config_flags finds the overrides in the argv it is given (else in sys.argv).
    config_flags.DEFINE_config_file(
        "config", None, "config file, optionally with variants: file.py[:variant,...]",
        flag_values=flag_values, lock_config=True, sys_argv=argv)
    if define_flags is not None:
        define_flags(flag_values)
    try:
        positional = flag_values(argv)[1:]
        config = flag_values.config
    except flags.Error as err:
        raise ConfigError([_last_line(str(err))]) from None
    except (AttributeError, KeyError) as err:  # config_flags' answer to an unknown key
        raise ConfigError([_unknown_setting(argv, err)]) from None
    except OSError as err:
        raise ConfigError([_last_line(str(err))]) from None
    if positional:
        raise ConfigError([f"unexpected argument {positional[0]!r} (settings are --config.key=value)"])
    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return from_dict(data), flag_values


def load_config(spec: str, overrides: Sequence[str] = (), config_dir: str | None = None) -> RunConfig:
    """`spec` is "file.py" or "file.py:variant[,variant]"; `overrides` are "a.b=value" strings."""
    for override in overrides:
        if "=" not in override or override.startswith("="):
            raise ConfigError([f"override {override!r}: expected key=value"])
    argv = ["load_config", CONFIG_FLAG + spec] + [f"--config.{o}" for o in overrides]
    return parse_command_line(argv, config_dir)[0]


def _resolve(spec: str, config_dir: str | None) -> str:
    path, sep, variant = spec.partition(":")
    candidates = [path] + ([os.path.join(config_dir, path)] if config_dir else [])
    found = next((c for c in candidates if os.path.isfile(c)), None)
    if found is None:
        where = f" (also looked in {config_dir})" if config_dir else ""
        raise ConfigError([f"config file {path!r} not found{where}"])
    return os.path.abspath(found) + sep + variant


def _last_line(message: str) -> str:
    """absl's message, or the config file's own error where absl wraps its traceback."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith("Error whilst parsing config file:"):
        return f"{lines[0].removesuffix(' Error whilst parsing config file:')} {lines[-1]}"
    return " ".join(lines) if len(lines) <= 3 else lines[-1]


def _unknown_setting(argv: Sequence[str], err: Exception) -> str:
    name = str(err).strip("\"'").split("'")[0]
    offending = next((a for a in argv if a.startswith("--config.")
                      and name in a.partition("=")[0].split(".")), None)
    key = offending.partition("=")[0][len("--config."):] if offending else name
    return f"{key}: unknown setting ({name!r} is not in the config)"
