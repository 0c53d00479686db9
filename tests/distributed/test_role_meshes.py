"""Disjoint actor and extractor meshes on 8 simulated devices: the models live on their own device
sets and a training run updates both; bad splits fail with one clear line."""

import jax
import pytest

from crl_jax import roles
from crl_jax import trainer as trainer_lib
from tests.trainer.test_switches import logged_rows, seed_bank


def devices_of(state):
    return {d for leaf in jax.tree.leaves(state.params) for d in leaf.sharding.device_set}


def test_disjoint_role_meshes_run_and_update_both_models(make_config, tmp_path):
    cfg = make_config(tasks=("test/coin",), steps=2, extractor_devices=2, mesh_shape=(1, -1, 2),
                      memory={"warmup_steps": 1, "merge_every": 0})
    trainer = trainer_lib.Trainer(cfg, str(tmp_path))
    assert dict(trainer.mesh.shape) == {"data": 1, "fsdp": 3, "tensor": 2}
    assert dict(trainer.extractor_mesh.shape) == {"data": 1, "fsdp": 2, "tensor": 1}
    actor, extractor = devices_of(trainer.actor_state), devices_of(trainer.extractor_state)
    assert len(actor) == 6 and len(extractor) == 2 and not actor & extractor
    seed_bank(trainer)
    trainer.run()
    rows = logged_rows(tmp_path)
    assert "actor/loss" in rows[1] and "extractor/loss" in rows[1]  # both models' steps ran
    assert int(trainer.actor_state.step) + rows[1]["actor/skipped"] == 1
    assert int(trainer.extractor_state.step) + rows[1]["extractor/skipped"] == 1
    assert devices_of(trainer.extractor_state) == extractor  # updated in place on its own devices


@pytest.mark.parametrize("split,shape,extractor_shape,message", [
    (8, (1, -1, 1), (1, -1, 1), "leaves no device for the actor"),
    (3, (1, 4, 1), (1, -1, 1), "mesh_shape: does not fit the actor's 5 devices"),
    (2, (1, -1, 1), (1, 4, 1), "extractor_mesh_shape: does not fit the extractor's 2 devices"),
])
def test_bad_splits_are_one_line_errors(split, shape, extractor_shape, message):
    with pytest.raises(ValueError, match=message):
        roles.role_meshes(shape, split, extractor_shape)


def test_colocated_by_default():
    actor, extractor = roles.role_meshes((1, -1, 1))
    assert actor is extractor and actor.devices.size == 8
