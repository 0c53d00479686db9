"""An update too large for the device stops the run at start-up with a config error naming the
setting to change, before the warm start or any rollout; one that fits passes the check."""

import os

import pytest

from crl_jax import trainer as trainer_lib
from crl_jax.config import ConfigError
from crl_jax.rl import aot, memory_fit


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


def test_the_fit_check_measures_the_sizes_of_the_program_that_runs(make_config, tmp_path):
    """The check compiles with `memory_fit.sizing_options` (LLVM at level 0 on a CPU, which is
    faster): XLA must report the same buffer sizes as for the optimised program the run uses."""
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
