"""Test harness: 8 simulated CPU devices, set before anything imports jax."""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
# Tests never reach a model hub: everything they load is made in the test or shipped in a package.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pytest.ini): one worker per core, at most four. Each worker holds its own JAX
    runtime with 8 simulated devices and its compiled programs (up to ~4 GiB), and runs whole
    files (`--dist loadfile`), so fixtures shared by a file's tests are built once. `-n 0` runs
    everything in one process."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(4, cores or 1))
