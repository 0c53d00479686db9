"""An update too large for the device stops the run at start-up with a config error naming the
setting to change, before the warm start or any rollout; one that fits passes the check, and the
check's program is the one the run's largest update loads. A program compiled only to be
measured reports the sizes of the one that runs."""

import logging
import os

import pytest

from crl_jax import trainer as trainer_lib
from crl_jax.config import ConfigError
from crl_jax.memory.text_store import Generation
from crl_jax.rl import aot, memory_fit
from crl_jax.rollout.trajectory import EpisodeSpec, Trajectory, generations_batch


def test_an_update_too_big_for_the_device_stops_before_any_training(make_config, tmp_path, monkeypatch):
    trainer = trainer_lib.Trainer(make_config(), str(tmp_path))
    trainer.check_update_fits()  # the tiny run fits this machine
    monkeypatch.setattr(memory_fit, "device_memory_bytes", lambda device: 1 << 20)  # a 1 MiB device
    with pytest.raises(ConfigError) as err:
        trainer.run()
    (problem,) = err.value.problems
    assert problem.startswith("rl.micro_batches:") and "which holds 0.0 GiB" in problem
    assert "raise rl.micro_batches (now 1; it must divide" in problem
    # Stopped before anything ran: no log, no warm start, no checkpoint.
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "warm_start").exists()
    assert not any(name.isdigit() for name in os.listdir(tmp_path / "checkpoints"))


def test_a_program_compiled_only_to_be_measured_has_the_sizes_of_the_one_that_runs(make_config,
                                                                                  tmp_path):
    """Memory tests compile with `memory_fit.sizing_options` (LLVM at level 0 on a CPU, which is
    faster): XLA must report the same buffer sizes as for the optimised program a run uses."""
    trainer = trainer_lib.Trainer(make_config(), str(tmp_path))
    r, e, u = trainer.cfg.rollout, trainer.cfg.extractor, trainer.updater
    device = u.mesh.devices.flat[0]
    assert memory_fit.sizing_options(device)  # a CPU: the cheaper compile is in use here

    def sizes(options):
        compiled = aot.compile_update(u.cfg, u.mesh, trainer.actor_state, trainer.extractor_state,
                                      (r.groups_per_step * r.group_size, u.max_seq_len),
                                      (e.batch_size, e.cache_length), options)
        m = compiled.memory_analysis()
        return (m.argument_size_in_bytes, m.output_size_in_bytes, m.alias_size_in_bytes,
                m.temp_size_in_bytes)

    measured, optimised = sizes(memory_fit.sizing_options(device)), sizes(None)
    assert measured == optimised and optimised[3] > 0


def test_the_first_update_at_the_checked_shapes_loads_the_checks_program(make_config, tmp_path,
                                                                         caplog):
    """With the persistent compile cache (on in every run by default, and in these tests), the
    start-up check's compile is not wasted: the run's first update at the largest shapes, as the
    updater builds it from episodes, loads the program the check compiled."""
    trainer = trainer_lib.Trainer(make_config(), str(tmp_path))
    r, e, u = trainer.cfg.rollout, trainer.cfg.extractor, trainer.updater
    trainer.check_update_fits()
    episodes = [Trajectory(EpisodeSpec("test/coin", 0, k // r.group_size, k % 2 == 1),
                           tokens=[1] * u.max_seq_len, loss_mask=[1.0] * u.max_seq_len,
                           logprobs=[0.0] * u.max_seq_len, reward=float(k % 2))
                for k in range(r.groups_per_step * r.group_size)]
    generations = [(Generation((1,) * 8, (2,) * 8, (0.0,) * 8), 1.0, 1.0)] * e.batch_size
    extractor_batch = generations_batch(generations, e.cache_length, e.batch_size)
    with caplog.at_level(logging.DEBUG, logger="jax._src.compiler"):
        _, _, metrics = u(trainer.actor_state, trainer.extractor_state, episodes, extractor_batch)
    assert metrics  # the update ran
    assert any("cache hit for 'jit_train_step'" in m for m in caplog.messages), caplog.messages
