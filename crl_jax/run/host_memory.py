"""Huge pages for the host's large allocations (Linux with glibc, transparent huge pages on request).

XLA's CPU runtime takes each execution's temporaries from malloc and frees them when the execution
ends. glibc serves blocks of that size with a fresh mmap and returns them with munmap, so every
train step or generate call faults its temporaries back in, 4 KiB at a time: the micro preset's
update at 32 x 1,024 tokens touched 3.9 GB of new pages a step, about 970,000 page faults and
1.9 s of kernel time. glibc's `glibc.malloc.hugetlb=1` tunable makes malloc ask for transparent
huge pages (2 MiB) instead: about 2,000 faults a step, and the step takes about 0.8 of the time
(docs/benchmarks.md). Where the kernel gives huge pages to every mapping anyway (mode `always`)
or never (`never`), the tunable changes nothing and is not set.

glibc reads its tunables when a process starts, so `reexec_with_huge_pages` runs the same command
again with the tunable added to the environment, before anything heavy is imported. Set
CRL_JAX_HUGE_PAGES=0 to keep malloc as it is.
"""

from __future__ import annotations

import os
import platform
import sys

TUNABLE = "glibc.malloc.hugetlb=1"
SWITCH = "CRL_JAX_HUGE_PAGES"  # "0": off; set to "on" in the re-executed process
THP_MODE_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"
MIN_GLIBC = (2, 35)  # the first glibc with glibc.malloc.hugetlb


def huge_page_environ(environ=None, libc: tuple[str, str] | None = None,
                      thp_mode: str | None = None) -> dict[str, str]:
    """The environment variables to add so that a new process gets huge pages from malloc; empty
    where it has them already, cannot get them, or the switch is off. (libc and thp_mode default
    to this machine's; tests pass their own.)"""
    environ = os.environ if environ is None else environ
    if environ.get(SWITCH) in ("0", "on") or sys.platform != "linux":
        return {}
    current = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in current:
        return {}
    name, version = platform.libc_ver() if libc is None else libc
    if name != "glibc" or _version(version) < MIN_GLIBC:
        return {}
    if (_thp_mode() if thp_mode is None else thp_mode) != "madvise":
        return {}
    return {"GLIBC_TUNABLES": ":".join(filter(None, [current, TUNABLE])), SWITCH: "on"}


def reexec_with_huge_pages() -> None:
    """Replace this process by the same command run with `huge_page_environ`'s variables;
    return at once where there are none to add."""
    extra = huge_page_environ()
    if not extra:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, {**os.environ, **extra})


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(".")[:2])
    except ValueError:
        return (0,)


def _thp_mode() -> str:
    """The bracketed word of the kernel's transparent-huge-page mode ("" where unreadable)."""
    try:
        with open(THP_MODE_FILE) as f:
            text = f.read()
    except OSError:
        return ""
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else ""
