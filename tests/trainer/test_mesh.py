"""Two full steps of a tiny multi-task run on a (data, fsdp, tensor) = (2, 2, 2) mesh."""

import jax

from crl_jax import trainer as trainer_lib


def test_two_multitask_steps_on_8_simulated_devices(make_config, tmp_path):
    assert jax.device_count() == 8
    cfg = make_config(tasks=("sokoban/6x6-2box", "test/coin"), steps=2, mesh_shape=(2, 2, 2),
                      memory={"warmup_steps": 1, "merge_every": 0})
    trainer = trainer_lib.Trainer(cfg, str(tmp_path))
    assert dict(trainer.mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    wq = trainer.actor_state.params["layers"]["wq"].value
    assert len(wq.sharding.device_set) == 8
    last = trainer.run()
    assert int(trainer.actor_state.step) + last["actor/skipped"] == 1  # step 1 updated the actor
    assert last["train/episodes"] == 8
    assert {"train/episodes/sokoban/6x6-2box", "train/episodes/test/coin"} <= set(last)
    assert trainer.checkpointer.latest_step() == 2
