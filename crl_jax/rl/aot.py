"""Ahead-of-time compilation of the joint train step for a TPU topology, without a TPU.

`jax.experimental.topologies` describes a TPU slice (e.g. "v5p:2x2x2") through libtpu's
compile-only client; the train step is lowered with abstract states and batches (nothing is
allocated) and compiled for that slice. The compiled program reports per-chip memory
(`memory_analysis`) and FLOPs (`cost_analysis`), which is how a slice is sized before renting it.

Needs the `libtpu` package (no TPU hardware). libtpu takes a machine-wide lock meant for real TPU
VMs; compile-only use sets ALLOW_MULTIPLE_LIBTPU_LOAD so it does not contend for it.

Legend: B batch, T time.
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import Mesh

from crl_jax import models
from crl_jax.rl import batch as batch_lib
from crl_jax.rl import memory_fit
from crl_jax.rl import state as state_lib
from crl_jax.rl import train_step as ts

# HBM per chip usable by a program, in GiB, by topology-name prefix (v5p and v5e: the figures
# libtpu's compiler reports in its out-of-memory messages; v4, v6e: nominal).
HBM_GIB = {"v5p": 95.74, "v5e": 15.75, "v5litepod": 15.75, "v4": 32.0, "v6e": 32.0}


def _prepare_libtpu_env() -> None:
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


def topology_mesh(topology: str, mesh_shape: tuple[int, int, int] | None = None):
    """A (data, fsdp, tensor) mesh over the compile-only devices of `topology` ("v5p:2x2x1").

    mesh_shape may hold one -1 (filled from the chip count); default: all chips on fsdp."""
    _prepare_libtpu_env()
    from jax.experimental import topologies  # imported late: the env above must be set first

    topo = topologies.get_topology_desc(topology, "tpu")
    n = len(topo.devices)
    shape = list(mesh_shape or (1, n, 1))
    if -1 in shape:
        known = 1
        for size in shape:
            known *= size if size > 0 else 1
        shape[shape.index(-1)] = n // known
    # Splitting physical axes lets e.g. a 4-wide tensor axis live inside an 8x8 v5e slice.
    devices = mesh_utils.create_device_mesh(tuple(shape), list(topo.devices),
                                            allow_split_physical_axes=True)
    return Mesh(devices, ("data", "fsdp", "tensor"))


def abstract_state(cfg: models.DecoderConfig, opt_cfg: state_lib.OptimizerConfig):
    """A TrainState of ShapeDtypeStructs for a decoder config: nothing is allocated."""
    tx = state_lib.make_optimizer(opt_cfg)

    def init():
        graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))
        return state_lib.TrainState.create(graphdef, params, tx)

    return jax.eval_shape(init)


def abstract_batch(batch: int, seq: int) -> batch_lib.PolicyBatch:
    s = jax.ShapeDtypeStruct
    bt = (batch, seq)
    return batch_lib.PolicyBatch(
        tokens=s(bt, jnp.int32), positions=s(bt, jnp.int32), attention_mask=s(bt, jnp.bool_),
        loss_mask=s(bt, jnp.float32), old_logprobs=s(bt, jnp.float32),
        rewards=s((batch,), jnp.float32), group_ids=s((batch,), jnp.int32),
        guided=s((batch,), jnp.bool_), weights=s((batch,), jnp.float32),
        valid=s((batch,), jnp.bool_))


@dataclasses.dataclass(frozen=True)
class AotSpec:
    actor: models.DecoderConfig
    extractor: models.DecoderConfig | None
    actor_batch: int
    actor_seq: int
    extractor_batch: int = 0
    extractor_seq: int = 0
    train: ts.TrainConfig = ts.TrainConfig()
    optimizer: state_lib.OptimizerConfig = state_lib.OptimizerConfig()


def compile_update(train_cfg: ts.TrainConfig, mesh: Mesh, actor_state, extractor_state,
                   actor_shape: tuple[int, int], extractor_shape: tuple[int, int] | None = None,
                   compiler_options: dict | None = None):
    """The joint update compiled on `mesh` for batches of (rows, tokens) shapes, from abstract
    inputs: nothing is allocated or run. The states may be concrete or abstract; without an
    extractor shape the step updates the actor only. `compiler_options` go to XLA (e.g.
    `memory_fit.sizing_options` for a compile that is only measured)."""
    batch = batch_lib.TrainBatch(abstract_batch(*actor_shape),
                                 None if extractor_shape is None else abstract_batch(*extractor_shape))
    step = ts.make_train_step(train_cfg, mesh, actor_state, extractor_state, batch)
    return step.lower(actor_state, extractor_state, batch).compile(compiler_options=compiler_options)


def compile_train_step(spec: AotSpec, topology: str, mesh_shape=None) -> dict:
    """Compile the joint step for `topology`; return per-chip memory (bytes) and FLOPs."""
    mesh = topology_mesh(topology, mesh_shape)
    actor = abstract_state(spec.actor, spec.optimizer)
    extractor = None if spec.extractor is None else abstract_state(spec.extractor, spec.optimizer)
    compiled = compile_update(spec.train, mesh, actor, extractor, (spec.actor_batch, spec.actor_seq),
                              None if spec.extractor is None else (spec.extractor_batch, spec.extractor_seq))
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    peak = memory_fit.peak_bytes(mem)
    kind = mesh.devices.flat[0].device_kind
    family = topology.split(":")[0].lower()
    hbm = HBM_GIB.get(family, HBM_GIB.get(kind.split()[-1].lower(), float("nan"))) * 2**30
    return {
        "topology": topology, "chips": mesh.devices.size, "device_kind": kind,
        "mesh": dict(zip(mesh.axis_names, mesh.devices.shape)),
        "argument_bytes": mem.argument_size_in_bytes, "output_bytes": mem.output_size_in_bytes,
        "alias_bytes": mem.alias_size_in_bytes, "temp_bytes": mem.temp_size_in_bytes,
        "code_bytes": mem.generated_code_size_in_bytes, "peak_bytes_per_chip": peak,
        "hbm_bytes_per_chip": hbm, "fits": bool(peak <= hbm),
        "flops_per_chip": float(cost.get("flops", float("nan"))),
    }
