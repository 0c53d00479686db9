"""One training run per workdir: an exclusive lock on `<workdir>/.lock`, held while the run lives.

Two trainers on one workdir corrupt it without an error: the second, finding no checkpoint yet,
"resumes" from step 0 and truncates `metrics.jsonl` and `samples.jsonl` under the first, which
goes on writing to a file no longer in the folder, and both would save checkpoints there. With the
lock the second trainer stops at once with `WorkdirInUse`, naming the holder.

The lock is an advisory `flock`, so the kernel drops it when its process ends, however it ends: a
killed run leaves no stale lock behind, and its restart takes the workdir back. Within one process
it is re-entrant (a resumed `Trainer` in the same process, the warm-start probe's trainer), so it
only ever keeps *other* processes out. Multi-host runs lock on process 0 only: a workdir shared by
the hosts of one run is used by all of them.
"""

from __future__ import annotations

import fcntl
import os
import socket

LOCK_FILE = ".lock"
_held: dict[str, object] = {}  # realpath of the workdir -> its open, locked lock file


class WorkdirInUse(RuntimeError):
    """Another process holds the workdir's lock."""


def acquire(workdir: str) -> None:
    """Lock `workdir` for this process (no-op if it already holds it); raises WorkdirInUse."""
    key = os.path.realpath(workdir)
    if key in _held:
        return
    handle = open(os.path.join(workdir, LOCK_FILE), "a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown process"
        handle.close()
        raise WorkdirInUse(f"workdir {workdir} is in use by another training run ({holder}); "
                           "wait for it to end, or choose another --workdir") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    _held[key] = handle


def release(workdir: str) -> None:
    """Give the workdir back (the end of a run); a no-op if this process does not hold it."""
    handle = _held.pop(os.path.realpath(workdir), None)
    if handle is not None:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
