"""TensorBoard event files for scalars, written directly in the TFRecord + protobuf wire format.

Owns `EventFileWriter`: one `events.out.tfevents.*` file per writer, one `Event` (holding a
`Summary` of simple_value scalars) per `add_scalars` call, written synchronously and flushed, so a
killed run keeps every step it logged. A writer opened with `purge_step` starts with a SessionLog
START at that step, which makes TensorBoard hide the older events from that step on (resume).

Why not tensorboardX's SummaryWriter: importing tensorboardX imports torch whenever torch is
installed (seconds and hundreds of MB in every training process), and its writes go through a
background thread. The format itself is small and stable:
  record = u64 length | u32 masked_crc32c(length) | data | u32 masked_crc32c(data)   (little endian)
  Event: wall_time=1 (double), step=2 (int64), file_version=3, summary=5, session_log=7
  Summary: value=1 (repeated Value); Value: tag=1 (string), simple_value=2 (float)
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Mapping


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 fields encode negatives as ten-byte two's complement
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _field(number, 2) + _varint(len(payload)) + payload


def encode_event(step: int, wall_time: float, *, scalars: Mapping[str, float] | None = None,
                 file_version: str | None = None, session_start: bool = False) -> bytes:
    """Serialised `Event` proto with exactly one of: scalars, file_version, session START."""
    out = _field(1, 1) + struct.pack("<d", wall_time) + _field(2, 0) + _varint(int(step))
    if file_version is not None:
        out += _bytes_field(3, file_version.encode())
    elif session_start:
        out += _bytes_field(7, _field(1, 0) + _varint(1))  # SessionLog{status: START}
    else:
        values = b"".join(
            _bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5) + struct.pack("<f", v))
            for tag, v in (scalars or {}).items())
        out += _bytes_field(5, values)
    return out


def frame_record(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return (header + struct.pack("<I", masked_crc32c(header)) + data
            + struct.pack("<I", masked_crc32c(data)))


_last_ns = 0


def _file_name() -> str:
    # TensorBoard reads a run's files in name order and a resumed run must come after the run it
    # resumes, even within the same second: a strictly increasing nanosecond stamp follows the host.
    global _last_ns
    _last_ns = max(time.time_ns(), _last_ns + 1)
    return f"events.out.tfevents.{_last_ns // 10**9:010d}.{socket.gethostname()}.{_last_ns:020d}"


class EventFileWriter:
    """Appends scalar events to a fresh event file in `logdir`."""

    def __init__(self, logdir: str, purge_step: int | None = None, fsync: bool = True):
        os.makedirs(logdir, exist_ok=True)
        self.path = os.path.join(logdir, _file_name())
        self._file = open(self.path, "wb")
        self._fsync = fsync
        now = time.time()
        step0 = 0 if purge_step is None else purge_step
        self._write(encode_event(step0, now, file_version="brain.Event:2"))
        if purge_step is not None:
            self._write(encode_event(purge_step, now, session_start=True))
        self.flush()

    def _write(self, event: bytes):
        self._file.write(frame_record(event))

    def add_scalars(self, step: int, scalars: Mapping[str, float], wall_time: float | None = None):
        """One event holding every scalar of `step`, written and flushed before returning."""
        self._write(encode_event(step, time.time() if wall_time is None else wall_time,
                                 scalars=scalars))
        self.flush()

    def flush(self):
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())

    def close(self):
        if not self._file.closed:
            self._file.close()
