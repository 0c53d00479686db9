"""A caching malloc for runs on a CPU host: tcmalloc, preloaded where the system has it.

XLA's CPU runtime takes each execution's temporaries from malloc and frees them when the
execution ends. glibc maps blocks that large afresh and unmaps them on free, so every step faults
its temporaries back in, one zeroed 4 KiB page at a time: for the micro preset's update at
32 x 1,024 tokens about 970,000 faults and 1.8 s of kernel time a step. tcmalloc keeps freed
blocks for reuse: no faults after the first step, and that update takes about 0.8 of the time
(docs/benchmarks.md). glibc cannot be told to do the same (a thread's arena maps any block over
64 MiB itself, and a single arena makes every thread wait on its lock); jemalloc's defaults hand
large blocks back at once.

A malloc replaces glibc's only when it is loaded first, so `reexec_with_caching_malloc` runs the
same command again with tcmalloc in LD_PRELOAD, before anything heavy is imported. It looks for
libtcmalloc_minimal (Debian and Ubuntu: `apt install libtcmalloc-minimal4`) and, without it, lets
the run go on with the system's malloc. CRL_JAX_MALLOC=system keeps the system's malloc.

`usage` reads the figures a run logs each step: resident memory now and at its peak, and the
bytes tcmalloc holds free for reuse (resident, but in use by nothing), which is its price.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import resource
import sys
from typing import NamedTuple

SWITCH = "CRL_JAX_MALLOC"  # "system": leave malloc alone; "tcmalloc" in the re-executed process
LIBRARIES = ("tcmalloc_minimal", "tcmalloc")  # the minimal one has no profiler to set up
# tcmalloc reports every allocation over 1 GiB on stderr; an update's temporaries are that big.
QUIET_LARGE_ALLOCATIONS = {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(2**50)}


def find_tcmalloc() -> str | None:
    """The shared library's name as the dynamic loader finds it, or None."""
    for name in LIBRARIES:
        found = ctypes.util.find_library(name)
        if found:
            return found
    return None


def caching_malloc_environ(environ, find_library=None) -> dict[str, str]:
    """The variables to add so that a new process runs on tcmalloc; empty where the switch is off,
    the process has it already, or `find_library` (default `find_tcmalloc`) finds none. The
    library is looked for only when it is wanted."""
    if sys.platform != "linux" or environ.get(SWITCH) in ("system", "tcmalloc"):
        return {}
    if malloc_in_use(environ) == "tcmalloc":
        return {}
    preloaded = environ.get("LD_PRELOAD", "")
    library = (find_library or find_tcmalloc)()
    if library is None:
        return {}
    extra = {"LD_PRELOAD": ":".join(filter(None, [library, preloaded])), SWITCH: "tcmalloc"}
    extra.update({k: v for k, v in QUIET_LARGE_ALLOCATIONS.items() if k not in environ})
    return extra


def malloc_in_use(environ=None) -> str:
    """"tcmalloc" where this process has it preloaded, else "system" (a benchmark's label)."""
    environ = os.environ if environ is None else environ
    return "tcmalloc" if "tcmalloc" in environ.get("LD_PRELOAD", "") else "system"


def reexec_with_caching_malloc() -> None:
    """Replace this process by the same command with tcmalloc preloaded; return at once where
    `caching_malloc_environ` has nothing to add. An unknown switch value stops with one line."""
    switch = os.environ.get(SWITCH, "")
    if switch not in ("", "system", "tcmalloc"):
        print(f"error: {SWITCH}={switch!r}: set it to 'system' to keep the system's malloc, or leave "
              "it unset", file=sys.stderr)
        sys.exit(2)
    extra = caching_malloc_environ(os.environ)
    if not extra:
        return
    # Silent: a run's stderr is kept to its own lines (a bad config is one line). The re-executed
    # process has CRL_JAX_MALLOC=tcmalloc in its environment.
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, {**os.environ, **extra})


class HostMemory(NamedTuple):
    """One reading of this process's memory, in GB (1e9 bytes)."""
    rss_gb: float               # resident now
    peak_rss_gb: float          # the most resident so far
    malloc_free_gb: float | None  # held free by tcmalloc for reuse; None on another malloc


def usage() -> HostMemory:
    """This process's memory now."""
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = peak_kib if sys.platform == "darwin" else peak_kib * 1024  # darwin reports bytes
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # no /proc: the peak is the best figure there is
        rss = peak
    free = _tcmalloc_free_bytes()
    return HostMemory(rss / 1e9, peak / 1e9, None if free is None else free / 1e9)


def _tcmalloc_free_bytes() -> int | None:
    """The bytes tcmalloc's page heap holds free (mapped, unused), or None without tcmalloc."""
    get = _tcmalloc_get_property()
    value = ctypes.c_size_t()
    if get is None or not get(b"tcmalloc.pageheap_free_bytes", ctypes.byref(value)):
        return None
    return value.value


@functools.lru_cache(maxsize=None)
def _tcmalloc_get_property():
    """tcmalloc's C `MallocExtension_GetNumericProperty`, where this process has it preloaded."""
    if malloc_in_use() != "tcmalloc":
        return None
    get = getattr(ctypes.CDLL(None), "MallocExtension_GetNumericProperty", None)
    if get is not None:
        get.argtypes, get.restype = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)], ctypes.c_int
    return get
