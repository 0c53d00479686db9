"""Meshes per role: the actor and the extractor on one mesh, or on disjoint sets of devices.

Colocated (the default, `extractor_devices = 0`): both models, their samplers and the joint train
step share the run's mesh. Disjoint (`extractor_devices = n`): the last n devices hold the
extractor (its TrainState, its sampler, its update), the others the actor, so the extractor's
distillation on its own chips overlaps the actor's rollouts and update instead of time-sharing
them. A jitted program runs on one device set, so a disjoint run updates the two models with two
steps (crl_jax/rl/updater.py).
"""

from __future__ import annotations

import jax

from crl_jax import sharding


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


__all__ = ["role_meshes"]
