"""Memory sizing for generation: parameter, KV-cache and peak-temporary bytes, before any compute.

`memory_report("qwen2.5-7b", batch=128, cache_length=32768, dtype="bfloat16", mesh_shape=(...))`
answers "will this fit?" from shapes alone (`jax.eval_shape`, nothing is allocated). With a mesh
shape, per-device figures use the same logical-axis rules as the real sharding, including the
rule that a dimension the mesh axes do not divide stays replicated.

Legend: L layers, B batch, S cache slots, T prefill chunk, K kv heads, N query heads, H head dim,
D model, V vocab.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from crl_jax import models, sharding
from crl_jax.models.config import DTYPES

_GIB = float(1 << 30)


class _AbstractMesh:
    """Just enough of a Mesh (axis sizes) for sharding.logical_to_spec."""

    def __init__(self, shape: Sequence[int]):
        if len(shape) != len(sharding.MESH_AXES):
            raise ValueError(f"mesh_shape needs {len(sharding.MESH_AXES)} entries "
                             f"{sharding.MESH_AXES}, got {tuple(shape)}")
        self.shape = dict(zip(sharding.MESH_AXES, shape))


def _shard_bytes(shape, itemsize: int, axes, mesh) -> int:
    """Bytes of one device's shard of an array with the given logical axes."""
    count = int(np.prod(shape))
    if mesh is None:
        return count * itemsize
    spec = sharding.logical_to_spec(axes, mesh, shape)
    split = 1
    for entry in spec:
        for axis in (entry if isinstance(entry, tuple) else (entry,)):
            if axis is not None:
                split *= mesh.shape[axis]
    return count // split * itemsize


def memory_report(model: str | models.DecoderConfig, batch: int, cache_length: int,
                  dtype: str | None = None, param_dtype: str | None = None,
                  prefill_chunk: int | None = None,
                  mesh_shape: Sequence[int] | None = None) -> dict[str, float]:
    """Bytes needed to generate with `model` (a preset name or a DecoderConfig).

    dtype: compute/KV-cache dtype, param_dtype: weight storage dtype (default: the config's).
    prefill_chunk: tokens per row in the largest prefill call (default: cache_length); it sets
    the size of the attention-score and hidden-state temporaries.
    mesh_shape: (data, fsdp, tensor); adds per-device figures.

    Returns a dict of byte counts: params, kv_cache (k+v+valid+end), prefill_scores (attention
    probabilities of one layer, float32), prefill_activations (a few [B,T,max(D,F,N*H)] buffers
    of one layer), logits (decode step, float32), total (sum), and the same with a `_per_device`
    suffix when mesh_shape is given; plus `_gib` versions of total.
    """
    cfg = models.get_preset(model) if isinstance(model, str) else model
    if not isinstance(cfg, models.DecoderConfig):
        raise TypeError(f"memory_report needs a decoder preset or DecoderConfig, got {type(cfg).__name__}")
    overrides = {k: v for k, v in (("dtype", dtype), ("param_dtype", param_dtype)) if v is not None}
    cfg = cfg.replace(**overrides)
    if batch < 1 or cache_length < 1:
        raise ValueError(f"batch and cache_length must be >= 1, got {batch}, {cache_length}")
    chunk = cache_length if prefill_chunk is None else prefill_chunk
    act_size = np.dtype(DTYPES[cfg.dtype]).itemsize
    mesh = None if mesh_shape is None else _AbstractMesh(mesh_shape)

    abstract = nnx.eval_shape(lambda: models.Decoder(cfg, rngs=nnx.Rngs(0)))
    _, params = nnx.split(abstract)
    axes = models.param_logical_axes(params)
    leaves = jax.tree.leaves(jax.tree.map(
        lambda v, a: (v.value.shape, v.value.dtype.itemsize, a), params, axes,
        is_leaf=lambda x: isinstance(x, nnx.Variable)),
        is_leaf=lambda x: isinstance(x, tuple) and len(x) == 3)

    kv_shape = (cfg.num_layers, batch, cache_length, cfg.num_kv_heads, cfg.head_dim)
    cache_axes = models.CACHE_LOGICAL_AXES
    width = max(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim)
    parts = {
        "params": [(s, i, a) for s, i, a in leaves],
        "kv_cache": [(kv_shape, act_size, cache_axes.k), (kv_shape, act_size, cache_axes.v),
                     ((batch, cache_length), 1, cache_axes.valid), ((batch,), 4, cache_axes.end)],
        "prefill_scores": [((batch, cfg.num_heads, chunk, cache_length), 4,
                            ("batch", "heads", None, "cache_seq"))],
        "prefill_activations": [((4, batch, chunk, width), act_size, (None, "batch", None, "mlp"))],
        "logits": [((batch, cfg.vocab_size), 4, ("batch", "vocab"))],
    }
    report: dict[str, float] = {}
    for name, arrays in parts.items():
        report[name] = float(sum(int(np.prod(s)) * i for s, i, _ in arrays))
        if mesh is not None:
            report[name + "_per_device"] = float(sum(_shard_bytes(s, i, a, mesh) for s, i, a in arrays))
    report["total"] = sum(report[name] for name in parts)
    report["total_gib"] = report["total"] / _GIB
    if mesh is not None:
        report["total_per_device"] = sum(report[name + "_per_device"] for name in parts)
        report["total_per_device_gib"] = report["total_per_device"] / _GIB
    return report


def kv_cache_bytes(cfg: models.DecoderConfig, batch: int, cache_length: int, dtype: str | None = None) -> int:
    """k + v + valid + end bytes of `models.init_cache(cfg, batch, cache_length, dtype)`."""
    itemsize = np.dtype(DTYPES[dtype or cfg.dtype]).itemsize
    kv = 2 * cfg.num_layers * batch * cache_length * cfg.num_kv_heads * cfg.head_dim * itemsize
    return kv + batch * cache_length + 4 * batch
