"""TensorBoard event files for scalars, through tensorboard's own event protos and record writer.

Owns `EventFileWriter`: one `events.out.tfevents.*` file per writer, one `Event` (holding a
`Summary` of simple_value scalars) per `add_scalars` call, written synchronously and flushed (and
fsynced), so a killed run keeps every step it logged. A writer opened with `purge_step` starts with
a SessionLog START at that step, which makes TensorBoard hide the older events from that step on
(a resumed run). tensorboard's own `EventFileWriter` writes from a background thread, so a killed
run could lose its last steps; its `RecordWriter` and protos are used directly instead (neither
imports TensorFlow or torch).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

_last_ns = 0


def _file_name() -> str:
    # TensorBoard reads a run's files in name order and a resumed run must come after the run it
    # resumes, even within the same second: a strictly increasing nanosecond stamp follows the host.
    global _last_ns
    _last_ns = max(time.time_ns(), _last_ns + 1)
    return f"events.out.tfevents.{_last_ns // 10**9:010d}.{socket.gethostname()}.{_last_ns:020d}"


def scalars_event(step: int, wall_time: float, scalars: Mapping[str, float]) -> event_pb2.Event:
    values = [summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
              for tag, value in scalars.items()]
    return event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(value=values))


class EventFileWriter:
    """Appends scalar events to a fresh event file in `logdir`."""

    def __init__(self, logdir: str, purge_step: int | None = None, fsync: bool = True):
        os.makedirs(logdir, exist_ok=True)
        self.path = os.path.join(logdir, _file_name())
        self._file = open(self.path, "wb")
        self._records = RecordWriter(self._file)
        self._fsync = fsync
        now = time.time()
        step0 = 0 if purge_step is None else purge_step
        self._write(event_pb2.Event(wall_time=now, step=step0, file_version="brain.Event:2"))
        if purge_step is not None:
            self._write(event_pb2.Event(wall_time=now, step=purge_step, session_log=event_pb2.SessionLog(
                status=event_pb2.SessionLog.START)))
        self.flush()

    def _write(self, event: event_pb2.Event) -> None:
        self._records.write(event.SerializeToString())

    def add_scalars(self, step: int, scalars: Mapping[str, float], wall_time: float | None = None):
        """One event holding every scalar of `step`, written and flushed before returning."""
        self._write(scalars_event(step, time.time() if wall_time is None else wall_time, scalars))
        self.flush()

    def flush(self):
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())

    def close(self):
        if not self._file.closed:
            self._file.close()
