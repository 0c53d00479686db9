"""host_memory: when a run asks to be re-executed with tcmalloc, that the new command is the same one
with the library preloaded, and that it does what it is for: blocks as large as an update's
temporaries, allocated, touched and freed over and over, stop faulting in fresh pages; and that
`usage`, the memory a run logs each step, follows what is resident and what tcmalloc holds free."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from crl_jax.run import host_memory

LIB = "libtcmalloc_minimal.so.4"
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD is the Linux loader's")


@linux_only
def test_library_preloaded_before_what_was_there():
    extra = host_memory.caching_malloc_environ({}, lambda: LIB)
    assert extra["LD_PRELOAD"] == LIB and extra[host_memory.SWITCH] == "tcmalloc"
    assert extra.keys() >= host_memory.QUIET_LARGE_ALLOCATIONS.keys()
    kept = host_memory.caching_malloc_environ(
        {"LD_PRELOAD": "libother.so", "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": "5"}, lambda: LIB)
    assert kept["LD_PRELOAD"] == f"{LIB}:libother.so"
    assert "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD" not in kept  # the user's own value stays


@pytest.mark.parametrize("environ,library", [
    ({host_memory.SWITCH: "system"}, LIB),  # switched off
    ({host_memory.SWITCH: "tcmalloc"}, LIB),  # already re-executed
    ({"LD_PRELOAD": "/opt/lib/libtcmalloc.so"}, LIB),  # preloaded by the user
    ({}, None),  # not installed
])
def test_nothing_added_where_it_would_change_nothing(environ, library):
    assert host_memory.caching_malloc_environ(environ, lambda: library) == {}


def test_label_names_the_preloaded_allocator():
    assert host_memory.malloc_in_use({"LD_PRELOAD": f"/usr/lib/{LIB}:libother.so"}) == "tcmalloc"
    assert host_memory.malloc_in_use({"LD_PRELOAD": "libother.so"}) == "system"
    assert host_memory.malloc_in_use({}) == "system"


CHILD = textwrap.dedent("""
    import ctypes, json, os, resource, sys
    sys.path.insert(0, {root!r})
    from crl_jax.run import host_memory
    host_memory.reexec_with_caching_malloc()
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(8):  # 64 MiB blocks, as XLA's temporaries are: allocated, touched, freed
        block = libc.malloc(64 * 2**20)
        ctypes.memset(block, 1, 64 * 2**20)
        libc.free(block)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    print(json.dumps([os.environ.get("LD_PRELOAD", ""), sys.argv[1:], faults,
                      host_memory.usage().malloc_free_gb]))
""")


def _child(tmp_path, switch: str | None):
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(root=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", host_memory.SWITCH)}
    if switch:
        env[host_memory.SWITCH] = switch
    run = subprocess.run([sys.executable, str(script), "--flag=1", "two"], env=env, check=True,
                         capture_output=True, text=True)
    return run.stderr, *json.loads(run.stdout)


@linux_only
def test_reexecuted_command_is_the_same_and_stops_faulting(tmp_path):
    library = host_memory.find_tcmalloc()
    if library is None:
        pytest.skip("tcmalloc is not installed (apt install libtcmalloc-minimal4)")
    stderr, preloaded, argv, faults, held = _child(tmp_path, switch=None)
    assert preloaded == library and argv == ["--flag=1", "two"] and stderr == ""
    assert held >= 64 * 2**20 / 1e9  # the freed block, kept for reuse, is what usage() reports
    _, preloaded_without, _, faults_without, held_without = _child(tmp_path, switch="system")
    assert preloaded_without == "" and held_without is None
    assert faults_without > 8 * 10_000  # about 16,000 fresh 4 KiB pages for every block
    assert faults < faults_without / 4  # tcmalloc: the first block's pages only, then reused


@linux_only
def test_usage_follows_resident_memory():
    before = host_memory.usage()
    block = np.ones(50_000_000)  # 400 MB, every page touched
    during = host_memory.usage()
    assert during.rss_gb - before.rss_gb > 0.35
    assert during.peak_rss_gb >= during.rss_gb - 1e-3  # the peak counts what is resident now
    del block


def test_without_tcmalloc_the_command_runs_on(monkeypatch):
    def execve(*args):
        raise AssertionError(f"re-executed: {args}")

    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.setattr(host_memory, "find_tcmalloc", lambda: None)
    monkeypatch.delenv(host_memory.SWITCH, raising=False)
    host_memory.reexec_with_caching_malloc()  # returns: nothing to preload


def test_an_unknown_switch_value_is_one_line_and_status_2(monkeypatch, capsys):
    monkeypatch.setenv(host_memory.SWITCH, "glibc")
    with pytest.raises(SystemExit) as stop:
        host_memory.reexec_with_caching_malloc()
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: CRL_JAX_MALLOC='glibc'")
