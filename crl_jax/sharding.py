"""All sharding knowledge of crl_jax: meshes per role and the logical-axis rules table.

Models name logical axes only ("vocab", "embed", "mlp", "heads", "kv_heads", "head_dim", "layers",
"batch", "seq", ...). `LOGICAL_RULES` maps each onto the physical mesh axes `data`, `fsdp` and
`tensor`; nothing else in the package knows which mesh axis shards what.

Legend: B batch, T time, D model width, F MLP width, N query heads, K kv heads, H head dim, V vocab.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis -> mesh axis (or tuple of mesh axes, or None for replicated). Weights are sharded
# over `fsdp` along their model-width axis and over `tensor` along heads / MLP width / vocab, the
# usual Megatron-style split; activations and caches put the batch over (data, fsdp).
LOGICAL_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "seq": None,
    # Context parallelism (DecoderConfig.context_parallel): a long sequence's activations are split
    # along T over `fsdp`, MaxText's choice (the context axis doubles as an FSDP axis), and its
    # batch, too small to split there, over `data` only.
    "context": "fsdp",
    "context_batch": "data",
    "cache_seq": None,
    "layers": None,
    "vocab": "tensor",
    "embed": "fsdp",
    "mlp": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "norm": None,
    "memory_slots": ("data", "fsdp", "tensor"),
    "embedding": None,
}


def make_mesh(shape: Sequence[int] | None = None, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh. `shape` defaults to all devices on `fsdp`.

    A shape may contain one -1, filled from the device count.
    """
    devices = list(devices if devices is not None else jax.devices())
    n = len(devices)
    if shape is None:
        shape = (1, n, 1)
    shape = list(shape)
    if len(shape) != len(MESH_AXES):
        raise ValueError(f"mesh shape must have {len(MESH_AXES)} entries {MESH_AXES}, got {shape}")
    if shape.count(-1) > 1:
        raise ValueError(f"mesh shape may contain at most one -1, got {shape}")
    if -1 in shape:
        known = int(np.prod([s for s in shape if s != -1]))
        if known == 0 or n % known:
            raise ValueError(f"cannot fill mesh shape {shape} from {n} devices")
        shape[shape.index(-1)] = n // known
    if int(np.prod(shape)) != n:
        raise ValueError(f"mesh shape {tuple(shape)} needs {int(np.prod(shape))} devices, have {n}")
    return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def logical_to_spec(logical_axes: Sequence[str | None] | None, mesh: Mesh | None = None,
                    shape: Sequence[int] | None = None) -> PartitionSpec:
    """PartitionSpec for an array whose dimensions carry `logical_axes`.

    With `mesh` and `shape` given, a dimension that the mapped mesh axes do not divide evenly is
    left replicated (e.g. 2 kv heads on a 4-way tensor axis), and a mesh axis is never used twice.
    """
    if logical_axes is None:
        return PartitionSpec()
    used: set[str] = set()
    spec = []
    for dim, name in enumerate(logical_axes):
        if name is None:
            spec.append(None)
            continue
        if name not in LOGICAL_RULES:
            raise KeyError(f"logical axis {name!r} has no sharding rule; known: {sorted(LOGICAL_RULES)}")
        target = LOGICAL_RULES[name]
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a not in used)
        if mesh is not None:
            axes = tuple(a for a in axes if mesh.shape[a] > 1)
            if shape is not None:
                # Keep the longest prefix of mesh axes whose product divides the dimension.
                kept = []
                size = 1
                for a in axes:
                    if shape[dim] % (size * mesh.shape[a]) == 0:
                        kept.append(a)
                        size *= mesh.shape[a]
                axes = tuple(kept)
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*spec)


def logical_sharding(mesh: Mesh, logical_axes: Sequence[str | None] | None,
                     shape: Sequence[int] | None = None) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(logical_axes, mesh, shape))


def tree_shardings(mesh: Mesh, abstract_tree, axes_tree):
    """NamedShardings for `abstract_tree` (arrays or ShapeDtypeStructs) given a matching tree of
    logical-axis tuples (None means replicated). `abstract_tree` is a prefix of `axes_tree`, so
    each array meets its whole axes tuple."""
    return jax.tree.map(lambda x, axes: logical_sharding(mesh, axes, x.shape),
                        abstract_tree, axes_tree)


def constrain(x: jax.Array, mesh: Mesh | None, logical_axes: Sequence[str | None]) -> jax.Array:
    """`with_sharding_constraint` by logical axes; a no-op without a mesh."""
    if mesh is None:
        return x
    return jax.lax.with_sharding_constraint(x, logical_sharding(mesh, logical_axes, x.shape))
