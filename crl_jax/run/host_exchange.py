"""The byte format hosts exchange records in: msgpack, with an explicit list of record types.

Multi-host runs all-gather trajectories and broadcast extractor replies (crl_jax/run/distributed.py).
These are plain records, so they travel as msgpack, which cannot run code when read, unlike
pickle: lists, dicts, strings, numbers and None as themselves; tuples, numpy arrays and scalars,
and the dataclasses registered in `RECORD_TYPES` as tagged extension values. Anything else is a
TypeError when packed, and an unknown record name a ValueError when unpacked.
"""

from __future__ import annotations

import dataclasses

import msgpack
import numpy as np

_TUPLE, _ARRAY, _SCALAR, _RECORD = 1, 2, 3, 4


def _record_types() -> dict[str, type]:
    # Imported here: the record modules import the rollout and memory packages, which import
    # distributed.py, which imports this module.
    from crl_jax.memory.text_store import Generation
    from crl_jax.rollout.trajectory import EpisodeSpec, Trajectory

    return {cls.__name__: cls for cls in (EpisodeSpec, Generation, Trajectory)}


def pack(obj) -> bytes:
    return msgpack.packb(obj, default=_encode, use_bin_type=True, strict_types=True)


def unpack(data: bytes):
    return msgpack.unpackb(data, ext_hook=_decode, raw=False, strict_map_key=False)


def _encode(obj):
    if isinstance(obj, tuple):
        return msgpack.ExtType(_TUPLE, pack(list(obj)))
    if isinstance(obj, np.ndarray):
        return msgpack.ExtType(_ARRAY, pack([obj.dtype.str, list(obj.shape), obj.tobytes()]))
    if isinstance(obj, np.generic):
        return msgpack.ExtType(_SCALAR, pack([obj.dtype.str, obj.tobytes()]))
    if dataclasses.is_dataclass(obj) and _record_types().get(type(obj).__name__) is type(obj):
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        return msgpack.ExtType(_RECORD, pack([type(obj).__name__, fields]))
    for base in (bool, int, float, str, bytes, list, dict):
        if isinstance(obj, base):  # a subclass (an IntEnum, say) goes as its base type
            return base(obj)
    raise TypeError(f"cannot send a {type(obj).__name__} between hosts; register it in "
                    "crl_jax.run.host_exchange or send plain values")


def _decode(code: int, data: bytes):
    value = unpack(data)
    if code == _TUPLE:
        return tuple(value)
    if code == _ARRAY:
        dtype, shape, raw = value
        return np.frombuffer(raw, np.dtype(dtype)).reshape(shape).copy()
    if code == _SCALAR:
        dtype, raw = value
        return np.frombuffer(raw, np.dtype(dtype))[0]
    if code == _RECORD:
        name, fields = value
        types = _record_types()
        if name not in types:
            raise ValueError(f"unknown record type {name!r} from another host")
        return types[name](**fields)
    raise ValueError(f"unknown extension code {code} from another host")
