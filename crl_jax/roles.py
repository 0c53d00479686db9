"""Meshes per role: the actor and the extractor on one mesh, or on disjoint sets of devices.

Colocated (the default, `extractor_devices = 0`): both models, their samplers and the joint train
step share the run's mesh. Disjoint (`extractor_devices = n`): the last n devices hold the
extractor (its TrainState, its sampler, its update), the others the actor, so the extractor's
distillation on its own chips overlaps the actor's rollouts and update instead of time-sharing
them. A jitted program runs on one device set, so a disjoint run updates the two models with two
steps; each is the joint step restricted to one model, so the result equals the colocated update.
"""

from __future__ import annotations

import dataclasses

import jax
from jax.sharding import NamedSharding, PartitionSpec

from crl_jax import sharding
from crl_jax.rl.batch import TrainBatch, batch_shardings
from crl_jax.rl.state import state_shardings
from crl_jax.rl.train_step import make_train_step, train_step


def role_meshes(mesh_shape, extractor_devices: int = 0, extractor_mesh_shape=(1, -1, 1),
                devices=None):
    """(actor mesh, extractor mesh); the same object twice when colocated."""
    devices = list(devices if devices is not None else jax.devices())
    if not extractor_devices:
        mesh = sharding.make_mesh(mesh_shape, devices)
        return mesh, mesh
    if jax.process_count() > 1:
        raise ValueError("extractor_devices: disjoint role meshes are single-process only for now; "
                         "use extractor_devices=0 in a multi-host run")
    if extractor_devices >= len(devices):
        raise ValueError(f"extractor_devices: {extractor_devices} leaves no device for the actor "
                         f"(have {len(devices)})")
    split = len(devices) - extractor_devices
    try:
        actor = sharding.make_mesh(mesh_shape, devices[:split])
    except ValueError as err:
        raise ValueError(f"mesh_shape: does not fit the actor's {split} devices ({err})") from None
    try:
        extractor = sharding.make_mesh(extractor_mesh_shape, devices[split:])
    except ValueError as err:
        raise ValueError(f"extractor_mesh_shape: does not fit the extractor's {extractor_devices} "
                         f"devices ({err})") from None
    return actor, extractor


def make_extractor_step(cfg, mesh, extractor_state, extractor_batch):
    """The joint train step restricted to the extractor, jitted on the extractor's mesh."""
    cfg = dataclasses.replace(cfg, update_actor=False)

    def step(state, batch):
        _, state, metrics = train_step(None, state, TrainBatch(None, batch), cfg=cfg)
        return state, metrics

    state_sh = state_shardings(mesh, extractor_state)
    batch_sh = batch_shardings(mesh, extractor_batch)
    return jax.jit(step, in_shardings=(state_sh, batch_sh),
                   out_shardings=(state_sh, NamedSharding(mesh, PartitionSpec())), donate_argnums=(0,))


def split_update(trainer, actor_batch, extractor_batch) -> dict[str, float]:
    """One update of a disjoint-mesh run: the actor's step on its mesh, the extractor's on its own."""
    fns, metrics = trainer._step_fns, {}
    if trainer.train_cfg.update_actor:
        batch = TrainBatch(actor_batch)
        if "actor" not in fns:
            fns["actor"] = make_train_step(trainer.train_cfg, trainer.mesh, trainer.actor_state, None,
                                           batch)
        trainer.actor_state, _, actor_metrics = fns["actor"](trainer.actor_state, None, batch)
        metrics.update(actor_metrics)
    if extractor_batch is not None:
        if "extractor" not in fns:
            fns["extractor"] = make_extractor_step(trainer.train_cfg, trainer.extractor_mesh,
                                                   trainer.extractor_state, extractor_batch)
        trainer.extractor_state, ext_metrics = fns["extractor"](trainer.extractor_state, extractor_batch)
        metrics.update(ext_metrics)  # already named "extractor/..."
    return {k: float(v) for k, v in jax.device_get(metrics).items()}


__all__ = ["role_meshes", "make_extractor_step", "split_update"]
