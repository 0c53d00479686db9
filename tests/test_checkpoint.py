"""Checkpointer tests: exact round trips of TrainStates + bank + host JSON, sharded restore onto
target shardings, keep-last-N, corrupt/partial latest step -> previous step, async saves, digest."""

import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from crl_jax import checkpoint as ckpt
from crl_jax import models, sharding
from crl_jax.memory import bank as bank_lib
from crl_jax.rl.state import OptimizerConfig, TrainState, create_sharded_state, make_optimizer


def _tiny_config():
    return models.get_preset("tiny", num_layers=1, vocab_size=64, hidden_size=32,
                             intermediate_size=64, num_heads=2, num_kv_heads=1, head_dim=16)


@jax.jit
def _perturb_jit(tree, seed):
    return _perturb(tree, seed)


def _perturb(tree, seed):
    """Distinct, non-trivial values in every float leaf (so a wrong or stale step would show)."""
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    out = [x + jax.random.normal(k, x.shape, x.dtype) if jnp.issubdtype(x.dtype, jnp.floating)
           else x for x, k in zip(leaves, keys)]
    return jax.tree.unflatten(treedef, out)


def _build_states():
    tx = make_optimizer(OptimizerConfig(learning_rate=1e-3, weight_decay=0.1))
    graphdef, params = nnx.split(models.Decoder(_tiny_config(), rngs=nnx.Rngs(0)))
    actor = TrainState.create(graphdef, params, tx, jax.random.PRNGKey(1))
    # One real optimiser update, so Adam moments and counters are not their initial zeros.
    grads = _perturb(params, 7)
    updates, opt_state = tx.update(grads, actor.opt_state, params)
    actor = actor.replace(step=actor.step + 1, opt_state=opt_state,
                          params=jax.tree.map(lambda p, u: p + u, params, updates))
    extractor = TrainState.create(graphdef, _perturb(params, 3), tx, jax.random.PRNGKey(2))
    bank = bank_lib.init_bank(num_tasks=2, capacity=8, dim=4)
    keys = jax.random.normal(jax.random.PRNGKey(4), (3, 4))
    bank, _, _ = bank_lib.add(bank, keys, jnp.array([0, 1, 1]), step=5)
    return {"actor": actor, "extractor": extractor, "bank": bank}


@pytest.fixture(scope="module")
def states():
    """{"actor": TrainState, "extractor": TrainState, "bank": Bank} with non-default contents,
    built in one compiled call (eager construction dispatches hundreds of tiny ops)."""
    return jax.jit(_build_states)()


HOST = {"text_store": {"0": "Open the drawer before taking the key.", "1": "ünïcode ok"},
        "reward_buffer": [[0.25, -1.0, 1e-300], [3.0]], "counters": {"step": 12, "merges": 2},
        "task_position": 37, "np_rng": np.random.default_rng(0).bit_generator.state,
        "nothing": None, "flag": True}


def _assert_identical(a, b):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb  # same structure, including TrainState's static graphdef and tx
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def _zeros_like(tree):
    return jax.tree.map(jnp.zeros_like, tree)


def test_round_trip_exact(states, tmp_path):
    with ckpt.Checkpointer(tmp_path / "ck", async_save=False) as c:
        assert c.latest_step() is None
        c.save(10, states, HOST)
        assert c.latest_step() == 10
        # A zero-filled target: everything must come from the files.
        step, restored, host = c.restore(_zeros_like(states))
    assert step == 10 and host == HOST
    assert isinstance(restored["actor"], TrainState)
    _assert_identical(restored, states)
    assert restored["actor"].graphdef == states["actor"].graphdef
    assert restored["actor"].tx is states["actor"].tx


def test_sharded_round_trip_onto_target_shardings(tmp_path):
    tx = make_optimizer(OptimizerConfig())
    mesh = sharding.make_mesh((1, 2, 4))
    state = create_sharded_state(lambda rngs: models.Decoder(_tiny_config(), rngs=rngs), tx, mesh)
    bank = bank_lib.init_bank(2, 16, 4)
    bank_shardings = sharding.tree_shardings(mesh, bank, bank_lib.bank_logical_axes())
    bank = jax.device_put(bank, bank_shardings)
    tree = {"actor": state, "bank": bank}
    assert any(len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated
               for x in jax.tree.leaves(tree))

    with ckpt.Checkpointer(tmp_path / "ck") as c:
        c.save(1, tree, {"k": 1})
        # Restore onto a different layout (a 4x2 split): the target decides the sharding.
        mesh2 = sharding.make_mesh((1, 4, 2))
        abstract = jax.eval_shape(lambda: tree)
        from crl_jax.rl.state import state_shardings
        target_shardings = {"actor": state_shardings(mesh2, abstract["actor"]),
                            "bank": sharding.tree_shardings(mesh2, abstract["bank"],
                                                            bank_lib.bank_logical_axes())}
        target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                              abstract, target_shardings)
        step, restored, _ = c.restore(target)
    assert step == 1
    _assert_identical(restored, tree)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(target)):
        assert got.sharding.is_equivalent_to(want.sharding, got.ndim)


def test_keep_last_n_and_async_save(states, tmp_path):
    c = ckpt.Checkpointer(tmp_path / "ck", max_to_keep=2, async_save=True)
    versions = {}
    for step in (1, 2, 3, 4):
        versions[step] = _perturb_jit(states, step)
        host = {"step": step}
        c.save(step, versions[step], host)
        host["step"] = -1  # mutating after save must not reach the checkpoint
    c.wait()
    assert c.all_steps() == [3, 4]
    assert sorted(os.listdir(tmp_path / "ck")) == ["3", "4"]
    step, restored, host = c.restore(states)
    assert (step, host) == (4, {"step": 4})
    _assert_identical(restored, versions[4])
    with pytest.raises(ValueError, match="steps must increase"):
        c.save(4, states, {})
    c.close()


def _step_files(directory, step):
    root = pathlib.Path(directory) / str(step) / ckpt.DEVICE_ITEM
    return sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: -p.stat().st_size)


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_corrupt_latest_falls_back_to_previous(states, tmp_path, damage):
    directory = tmp_path / "ck"
    old, new = _perturb_jit(states, 1), _perturb_jit(states, 2)
    with ckpt.Checkpointer(directory, async_save=False) as c:
        c.save(1, old, {"step": 1})
        c.save(2, new, {"step": 2})
    victim = _step_files(directory, 2)[0]  # the largest array data file
    data = victim.read_bytes()
    if damage == "truncate":
        victim.write_bytes(data[: len(data) // 2])
    elif damage == "flip":  # same size: only the checksum can tell (Orbax restores it silently)
        victim.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    else:
        victim.unlink()

    c = ckpt.Checkpointer(directory)  # a restarted run
    with pytest.warns(ckpt.CorruptCheckpointWarning, match=r"step 2 .*unusable: file device/"):
        step, restored, host = c.restore(states)
    assert (step, host) == (1, {"step": 1})
    _assert_identical(restored, old)
    assert 2 in c.skipped
    # The bad step is moved aside, so the resumed run can save step 2 again.
    assert c.all_steps() == [1] and any((directory / ckpt.CORRUPT_DIR).iterdir())
    c.save(2, new, {"step": 2})
    c.wait()
    assert c.restore(states)[0] == 2
    c.close()


def test_no_valid_step_and_unfinished_save(states, tmp_path):
    directory = tmp_path / "ck"
    with ckpt.Checkpointer(directory, async_save=False) as c:
        with pytest.raises(ckpt.CheckpointError, match="no checkpoint"):
            c.restore(states)
        c.save(1, states, {})
    # A save killed before finalisation leaves only Orbax's temporary directory: never listed.
    (directory / f"2{ckpt._TMP_SUFFIX}" / ckpt.DEVICE_ITEM).mkdir(parents=True)
    (directory / "1" / ckpt.HOST_ITEM / "metadata").write_text("{")
    c = ckpt.Checkpointer(directory)
    assert c.all_steps() == [1]
    with pytest.warns(ckpt.CorruptCheckpointWarning), \
            pytest.raises(ckpt.CheckpointError, match=r"no valid checkpoint .*step 1: file host/"):
        c.restore(states)
    c.close()


def test_config_digest_mismatch(states, tmp_path):
    d1 = ckpt.config_digest({"model": {"layers": 1}, "train": {"num_steps": 10}},
                            ignore=("train.num_steps",))
    same = ckpt.config_digest({"train": {"num_steps": 99}, "model": {"layers": 1}},
                              ignore=("train.num_steps",))
    d2 = ckpt.config_digest({"model": {"layers": 2}, "train": {"num_steps": 10}},
                            ignore=("train.num_steps",))
    assert d1 == same != d2
    with ckpt.Checkpointer(tmp_path / "ck", digest=d1, async_save=False) as c:
        c.save(1, states, {"a": 1})
    with ckpt.Checkpointer(tmp_path / "ck", digest=d2) as c:
        with pytest.raises(ckpt.ConfigMismatchError, match=f"digest {d1}.*has {d2}"):
            c.restore(states)
        assert c.restore(states, ignore_digest=True)[2] == {"a": 1}


def test_bad_inputs_give_clear_errors(states, tmp_path):
    with ckpt.Checkpointer(tmp_path / "ck") as c:
        with pytest.raises(TypeError, match=r"host_state\['rng'\]: tuple .*list"):
            c.save(1, states, {"rng": (1, 2)})
        with pytest.raises(TypeError, match=r"int64 .*tolist"):
            c.save(1, states, {"n": np.int64(3)})
        c.save(1, states, {})
        c.wait()
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), states)
        with pytest.raises(ValueError, match="need a sharding"):
            c.restore(target)
        wrong = dict(states, bank=bank_lib.init_bank(2, 4, 4))  # another bank capacity
        with pytest.raises(ckpt.CheckpointError, match="does not fit the restore target"):
            c.restore(wrong)
