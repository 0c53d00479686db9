"""Safetensors reading (memory-mapped, lazy, validated) and atomic writing, bfloat16 included.

The format is an 8-byte little-endian header length, a JSON header (name -> dtype, shape, byte
offsets), then raw little-endian tensor bytes. Reading through numpy memory maps means a tensor is
only paged in when a shard of it is actually used, and bfloat16 works through ml_dtypes without
needing torch; the reader is kept because it turns every malformed header, offset or size into one
BadModelFile line naming the file. Writing goes through the `safetensors` package.
"""

from __future__ import annotations

import json
import os
import struct

import ml_dtypes
import numpy as np

from crl_jax.assets import REDOWNLOAD, BadModelFile

_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
    "BOOL": np.bool_,
}


class SafetensorsFile:
    """Lazy view of one .safetensors file: `names()`, `shape(name)`, `get(name) -> np.ndarray`."""

    def __init__(self, path: str):
        self.path = path
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise self._bad("shorter than a safetensors header")
            (header_len,) = struct.unpack("<Q", raw)
            if header_len > size - 8:
                raise self._bad(f"header length {header_len} past the end of the file ({size} bytes)")
            try:
                self._header = json.loads(f.read(header_len).decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as err:
                raise self._bad(f"unreadable header ({type(err).__name__})") from None
        if not isinstance(self._header, dict):
            raise self._bad("header is not a JSON object")
        self._header.pop("__metadata__", None)
        self._data_offset = 8 + header_len
        self._check_entries(size - self._data_offset)
        self._mmap = np.memmap(path, dtype=np.uint8, mode="r")

    def _bad(self, problem: str) -> BadModelFile:
        return BadModelFile(f"{self.path}: {problem}; {REDOWNLOAD}")

    def _check_entries(self, data_bytes: int) -> None:
        """Every tensor's dtype, shape and byte range agree, and its bytes are in the file (a
        download cut short is caught here, not as a reshape error deep in loading)."""
        for name, info in self._header.items():
            if not isinstance(info, dict) or info.get("dtype") not in _DTYPES:
                raise self._bad(f"tensor {name!r} has no supported dtype "
                                f"({info.get('dtype') if isinstance(info, dict) else info!r})")
            try:
                dtype = np.dtype(_DTYPES[info["dtype"]])
                shape = [int(d) for d in info["shape"]]
                start, end = (int(x) for x in info["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise self._bad(f"tensor {name!r} has a malformed header entry") from None
            if any(d < 0 for d in shape) or end - start != int(np.prod(shape)) * dtype.itemsize:
                raise self._bad(f"tensor {name!r}: shape {shape} and {dtype} disagree with its "
                                f"byte range {start}-{end}")
            if end > data_bytes:
                raise self._bad(f"truncated: tensor {name!r} ends at byte {end} of the data, "
                                f"which holds {data_bytes}")

    def names(self) -> list[str]:
        return list(self._header)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._header[name]["shape"])

    def get(self, name: str) -> np.ndarray:
        info = self._header[name]
        start, end = info["data_offsets"]
        raw = self._mmap[self._data_offset + start:self._data_offset + end]
        return raw.view(_DTYPES[info["dtype"]]).reshape(info["shape"])


def save_file(tensors: dict[str, np.ndarray], path: str, metadata: dict[str, str] | None = None):
    """Write `tensors` as one .safetensors file with the `safetensors` package, atomically (a temp
    file, then a rename), so a crash never leaves a half-written model behind."""
    from safetensors.numpy import save_file as write

    tmp = path + ".tmp"
    write({name: np.ascontiguousarray(array) for name, array in tensors.items()}, tmp,
          metadata=metadata or {"format": "pt"})
    os.replace(tmp, path)
