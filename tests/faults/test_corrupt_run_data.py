"""Damaged run data other than model files: the workdir's TFDS task splits, and checkpoints whose
bytes verify but whose bank or buffer is not one the run could have written (a step written by
another tool, or edited with its manifest rewritten). Each ends in one line or falls back to an
older step; nothing saved is changed."""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
from etils import epath

from crl_jax.run import checkpoint
from crl_jax.run.metrics import is_machine_figure
from tests.trainer.conftest import compile_cache, subprocess_env  # noqa: F401 (a fixture)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "experiments", "run.py")
TINY = os.path.join(ROOT, "tests", "trainer", "tiny_config.py")


def run(workdir, cache, steps=3):
    return subprocess.run([sys.executable, RUN, f"--config={TINY}:{steps}", f"--workdir={workdir}"],
                          cwd=ROOT, env=subprocess_env(cache), capture_output=True, text=True,
                          timeout=600)


def rows(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [{k: v for k, v in json.loads(line).items() if not is_machine_figure(k)} for line in f]


def digests(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def edit_host_state(step_dir, edit):
    """Change a step's host JSON and rewrite its manifest, so that only its content is wrong."""
    path = step_dir / "host" / "metadata"
    doc = json.loads(path.read_text())
    edit(doc["host_state"])
    path.write_text(json.dumps(doc))
    checkpoint._write_manifest(epath.Path(step_dir), with_checksums=True)


def phantom_entry(host):
    host["memory"]["text_store"].append({
        "entry_id": 999, "task": "sokoban/6x6-2box", "title": "t", "content": "c", "query": "q",
        "created_step": 0, "generation": None})


def malformed_buffer(host):
    host["buffer"] = [{"generation": {"prompt_ids": [1]}, "reward_sum": 1.0, "uses": 1}]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, compile_cache):
    workdir = tmp_path_factory.mktemp("reference")
    result = run(workdir, compile_cache)
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


def test_a_bank_or_buffer_the_run_could_not_have_written_falls_back_to_an_older_step(
        reference, tmp_path, compile_cache):
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    edit_host_state(workdir / "checkpoints" / "3", malformed_buffer)
    edit_host_state(workdir / "checkpoints" / "2", phantom_entry)
    result = run(workdir, compile_cache)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "reward buffer is malformed" in result.stderr
    assert "the bank and its text disagree: 0 entries without text, 1 texts without an entry" in result.stderr
    assert "restored checkpoint of step 1" in result.stderr
    assert rows(workdir) == rows(reference)


def test_no_usable_step_is_one_line_and_the_steps_stay(reference, tmp_path, compile_cache):
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    for step in ("1", "2", "3"):
        edit_host_state(workdir / "checkpoints" / step, phantom_entry)
    before = digests(workdir / "checkpoints")
    result = run(workdir, compile_cache)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no valid checkpoint in" in errors[0] and "move the folder aside" in errors[0]
    assert "Traceback" not in result.stderr
    moved = digests(workdir / "checkpoints")  # kept, only moved aside for inspection
    assert sorted(before.values()) == sorted(moved.values())


@pytest.mark.parametrize("damage", ["truncated", "info", "missing"])
def test_damaged_task_splits_are_one_line_and_the_checkpoints_stay(reference, tmp_path,
                                                                     compile_cache, damage):
    workdir = tmp_path / "run"
    shutil.copytree(reference, workdir)
    (train,) = (workdir / "tfds").rglob("task_splits-train.array_record*")
    if damage == "truncated":
        os.truncate(train, train.stat().st_size // 3)
    elif damage == "info":
        (train.parent / "dataset_info.json").write_text('{"name": ')
    else:
        train.unlink()
    before = digests(workdir / "checkpoints")
    result = run(workdir, compile_cache, steps=4)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and str(train.parent) in errors[0], result.stderr[-3000:]
    assert "task splits unreadable" in errors[0] and "delete the folder and rerun" in errors[0]
    assert "Traceback" not in result.stderr
    assert digests(workdir / "checkpoints") == before
