"""Loading an experiment: a config file, a variant, and `--config.key=value` overrides.

`load_config("single_task.py:baseline", ["rollout.group_size=4"])` imports the file, calls its
`get_config("baseline")`, applies the overrides and validates the result into a `RunConfig`.
Every failure (missing file, unknown variant, unknown key, unparsable value, invalid setting)
becomes a `ConfigError` with one line per problem, so the command line can print them without a
traceback.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from collections.abc import Sequence

from crl_jax.config import ConfigError, RunConfig, from_dict


def _load_file(path: str, config_dir: str | None):
    candidates = [path] + ([os.path.join(config_dir, path)] if config_dir else [])
    found = next((c for c in candidates if os.path.isfile(c)), None)
    if found is None:
        where = f" (also looked in {config_dir})" if config_dir else ""
        raise ConfigError([f"config file {path!r} not found{where}"])
    spec = importlib.util.spec_from_file_location(f"crl_jax_config_{abs(hash(found))}", found)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # a broken config file is a config problem, not a crash
        raise ConfigError([f"config file {found}: {type(err).__name__}: {err}"]) from None
    if not hasattr(module, "get_config"):
        raise ConfigError([f"config file {found} defines no get_config(arg)"])
    return module


def _parse_value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # bare words are strings: --config.tokenizer=word


def load_config(spec: str, overrides: Sequence[str] = (), config_dir: str | None = None) -> RunConfig:
    """`spec` is "file.py" or "file.py:variant[,variant]"; `overrides` are "a.b=value" strings."""
    path, _, arg = spec.partition(":")
    module = _load_file(path, config_dir)
    try:
        config = module.get_config(arg or None)
    except Exception as err:
        raise ConfigError([f"{spec}: {err}"]) from None
    data = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    problems = []
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep or not key:
            problems.append(f"override {override!r}: expected key=value")
            continue
        *parents, last = key.split(".")
        node = data
        for i, part in enumerate(parents):
            if not isinstance(node.get(part), dict):
                problems.append(f"{'.'.join(parents[:i + 1])}: unknown section")
                node = None
                break
            node = node[part]
        if node is None:
            continue
        if last not in node:
            problems.append(f"{key}: unknown setting (known: {', '.join(sorted(node))})")
            continue
        value = _parse_value(text)
        if isinstance(node[last], (list, tuple)) and isinstance(value, list):
            value = tuple(value)
        node[last] = value
    if problems:
        raise ConfigError(problems)
    return from_dict(data)
