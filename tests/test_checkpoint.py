"""Checkpointer tests: exact round trips of TrainStates + bank + host JSON, sharded restore onto
target shardings, keep-last-N, corrupt/partial latest step -> previous step, async saves, digest.

States are real structures (a tiny Decoder's params, AdamW state, a Bank) traced with eval_shape
and filled with random values from numpy, so the tests compile nothing."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from crl_jax.run import checkpoint as ckpt
from crl_jax import models, sharding
from crl_jax.memory import bank as bank_lib
from crl_jax.rl.state import OptimizerConfig, TrainState, make_optimizer, state_shardings

TX = make_optimizer(OptimizerConfig(learning_rate=1e-3, weight_decay=0.1))

HOST = {"text_store": {"0": "Open the drawer before taking the key.", "1": "ünïcode ok"},
        "reward_buffer": [[0.25, -1.0, 1e-300], [3.0]], "counters": {"step": 12, "merges": 2},
        "task_position": 37, "np_rng": np.random.default_rng(0).bit_generator.state,
        "nothing": None, "flag": True}


def _abstract_states():
    """Shapes of {"actor": TrainState, "extractor": TrainState, "bank": Bank, "misc": ...}."""
    cfg = models.get_preset("tiny", num_layers=1, vocab_size=64, hidden_size=32,
                            intermediate_size=64, num_heads=2, num_kv_heads=1, head_dim=16)

    def init():
        graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))
        return {"actor": TrainState.create(graphdef, params, TX, jax.random.PRNGKey(1)),
                "extractor": TrainState.create(graphdef, params, TX, jax.random.PRNGKey(2)),
                "bank": bank_lib.init_bank(num_tasks=2, capacity=16, dim=4),
                "misc": {"bf16": jnp.zeros((3, 5), jnp.bfloat16), "key": jax.random.key(0)}}
    return jax.eval_shape(init)


def _random_like(abstract, seed, shardings=None):
    """Arrays shaped like `abstract` with distinct random values (so a wrong or stale step shows),
    placed with `shardings` when given."""
    rng = np.random.default_rng(seed)

    def fill(x):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return jax.random.key(int(rng.integers(1 << 30)))
        dtype = np.dtype(x.dtype)
        if dtype == np.bool_:
            return rng.random(x.shape) < 0.5
        if np.issubdtype(dtype, np.integer):
            return rng.integers(0, 1000, x.shape).astype(dtype)
        return rng.standard_normal(x.shape).astype(dtype)

    host = jax.tree.map(fill, abstract)
    return jax.device_put(host, shardings) if shardings is not None else jax.device_put(host)


def _target_of(tree):
    """The restore target the trainer builds: shapes, dtypes and shardings, no values."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _bytes(x):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(x).tobytes()


def _assert_identical(a, b):
    la, ta = jax.tree.flatten(a)
    lb, tb = jax.tree.flatten(b)
    assert ta == tb  # same structure, including TrainState's static graphdef and tx
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert _bytes(x) == _bytes(y)


@pytest.fixture(scope="module")
def abstract():
    return _abstract_states()


@pytest.fixture(scope="module")
def states(abstract):
    return _random_like(abstract, 0)


def test_round_trip_exact(states, tmp_path):
    with ckpt.Checkpointer(tmp_path / "ck", async_save=False) as c:
        assert c.latest_step() is None
        c.save(10, states, HOST)
        assert c.latest_step() == 10
        step, restored, host = c.restore(_target_of(states))
    assert step == 10 and host == HOST
    assert isinstance(restored["actor"], TrainState) and isinstance(restored["bank"], bank_lib.Bank)
    _assert_identical(restored, states)
    assert restored["actor"].graphdef == states["actor"].graphdef
    assert restored["actor"].tx is TX


def test_portable_copy_restores_without_naming_the_folder_it_was_written_to(states, tmp_path):
    """Orbax's commit notes name the absolute path a step was written to; a portable copy (kept
    with a project's records) drops them and still verifies and restores exactly, also under a
    manifest written when the notes were listed."""
    written = tmp_path / "written_here"
    with ckpt.Checkpointer(written, async_save=False) as c:
        c.save(3, states, HOST)
    notes = [p for p in written.rglob(ckpt.COMMIT_NOTE)]
    assert notes and all(str(written) in p.read_text() for p in notes)
    copy = tmp_path / "copy"
    ckpt.portable_copy(written, copy)
    files = [p for p in copy.rglob("*") if p.is_file()]
    assert files and not any(str(tmp_path).encode() in p.read_bytes() for p in files)

    manifest = copy / "3" / ckpt.MANIFEST
    listed = json.loads(manifest.read_text())
    assert not any(ckpt.COMMIT_NOTE in name for name in listed["files"])
    listed["files"]["device/" + ckpt.COMMIT_NOTE] = {"size": 125, "sha256": "0" * 64}  # an older manifest
    manifest.write_text(json.dumps(listed))
    with ckpt.Checkpointer(copy, async_save=False) as c:
        step, restored, host = c.restore(_target_of(states))
        assert c.skipped == {}
    assert step == 3 and host == HOST
    _assert_identical(restored, states)


def test_sharded_round_trip_onto_target_shardings(abstract, tmp_path):
    def shardings_on(mesh):
        replicated = sharding.logical_sharding(mesh, None)
        bank_axes = bank_lib.bank_logical_axes()
        return {"actor": state_shardings(mesh, abstract["actor"]),
                "extractor": state_shardings(mesh, abstract["extractor"]),
                "bank": sharding.tree_shardings(mesh, abstract["bank"], bank_axes),
                "misc": jax.tree.map(lambda _: replicated, abstract["misc"])}

    tree = _random_like(abstract, 1, shardings_on(sharding.make_mesh((1, 2, 4))))
    assert sum(not x.sharding.is_fully_replicated for x in jax.tree.leaves(tree)) > 10
    with ckpt.Checkpointer(tmp_path / "ck") as c:
        c.save(1, tree, {"k": 1})
        # Restore onto another layout (4x2): the target decides where the shards go.
        wanted = shardings_on(sharding.make_mesh((1, 4, 2)))
        target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                              abstract, wanted)
        step, restored, _ = c.restore(target)
    assert step == 1
    _assert_identical(restored, tree)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(target)):
        assert got.sharding == want.sharding


def test_keep_last_n_and_async_save(abstract, states, tmp_path):
    c = ckpt.Checkpointer(tmp_path / "ck", max_to_keep=2, async_save=True)
    for step in (1, 2, 3, 4):
        tree, host = _random_like(abstract, 10 + step), {"step": step}
        c.save(step, tree, host)
        # Neither mutating the host dict nor donating the arrays after save reaches the files.
        host["step"] = -1
        jax.tree.map(lambda x: x.delete(), tree)
    c.wait()
    assert c.all_steps() == [3, 4]
    assert sorted(os.listdir(tmp_path / "ck")) == ["3", "4"]
    step, restored, host = c.restore(states)  # live arrays work as a target too
    assert (step, host) == (4, {"step": 4})
    _assert_identical(restored, _random_like(abstract, 14))
    with pytest.raises(ValueError, match="steps must increase"):
        c.save(4, states, {})
    c.close()


def _largest_device_file(directory, step):
    root = pathlib.Path(directory) / str(step) / ckpt.DEVICE_ITEM
    return max((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "truncate_without_manifest"])
def test_corrupt_latest_falls_back_to_previous(abstract, tmp_path, damage):
    directory = tmp_path / "ck"
    old, new = _random_like(abstract, 1), _random_like(abstract, 2)
    with ckpt.Checkpointer(directory, async_save=False) as c:
        c.save(1, old, {"step": 1})
        c.save(2, new, {"step": 2})
    victim = _largest_device_file(directory, 2)
    data = victim.read_bytes()
    if damage.startswith("truncate"):
        victim.write_bytes(data[: len(data) // 2])
        if damage == "truncate_without_manifest":  # then Orbax's own read error is the signal
            (directory / "2" / ckpt.MANIFEST).unlink()
    elif damage == "flip":  # same size: only the checksum can tell (Orbax restores it silently)
        victim.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    else:
        victim.unlink()

    c = ckpt.Checkpointer(directory)  # a restarted run
    why = "device arrays unreadable" if damage.endswith("manifest") else "file device/"
    with pytest.warns(ckpt.CorruptCheckpointWarning, match=f"step 2 .*unusable: {why}"):
        step, restored, host = c.restore(_target_of(old))
    assert (step, host) == (1, {"step": 1})
    _assert_identical(restored, old)
    assert list(c.skipped) == [2]
    # The bad step is moved aside, so the resumed run can save step 2 again.
    assert c.all_steps() == [1] and len(list((directory / ckpt.CORRUPT_DIR).iterdir())) == 1
    c.save(2, new, {"step": 2})
    c.wait()
    assert c.restore(_target_of(old))[0] == 2
    c.close()


_KILLED_SAVE = """
import os, signal, sys
import jax, numpy as np
from crl_jax.run import checkpoint as ckpt
c = ckpt.Checkpointer(sys.argv[1])
c.save(1, {"w": jax.numpy.arange(64.0)}, {"step": 1})
c.wait()
# Die the moment step 2's arrays and host state are all written, just before it is finalised.
ckpt._write_manifest = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
c.save(2, {"w": jax.numpy.arange(64.0) + 1}, {"step": 2})
c.wait()
print("unreachable")
"""


def test_killed_save_never_counts(tmp_path):
    directory = tmp_path / "ck"
    proc = subprocess.run([sys.executable, "-c", _KILLED_SAVE, str(directory)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert any(n.startswith("2" + ckpt._TMP_SUFFIX) for n in os.listdir(directory))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ckpt.CorruptCheckpointWarning)
        c = ckpt.Checkpointer(directory)
        assert c.all_steps() == [1]
        one_device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = {"w": jax.ShapeDtypeStruct((64,), jnp.float32, sharding=one_device)}
        step, restored, host = c.restore(target)
    assert (step, host) == (1, {"step": 1})
    np.testing.assert_array_equal(restored["w"], np.arange(64.0))
    c.save(2, {"w": jnp.zeros(64)}, {"step": 2})  # the step number is free again
    c.close()
    assert sorted(os.listdir(directory)) == ["1", "2"]  # the partial save was cleaned up


def test_no_valid_step(states, tmp_path):
    directory = tmp_path / "ck"
    with ckpt.Checkpointer(directory, async_save=False) as c:
        with pytest.raises(ckpt.CheckpointError, match="no checkpoint"):
            c.restore(states)
        c.save(1, states, {})
    (directory / "1" / ckpt.HOST_ITEM / "metadata").write_text("{")
    with ckpt.Checkpointer(directory) as c:
        with pytest.warns(ckpt.CorruptCheckpointWarning), pytest.raises(
                ckpt.CheckpointError, match=r"no valid checkpoint .*step 1: file host/metadata"):
            c.restore(states)


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


def test_bad_inputs_give_clear_errors(abstract, states, tmp_path):
    with ckpt.Checkpointer(tmp_path / "ck") as c:
        with pytest.raises(TypeError, match=r"host_state\['rng'\]: tuple .*list"):
            c.save(1, states, {"rng": (1, 2)})
        with pytest.raises(TypeError, match=r"int64 .*tolist"):
            c.save(1, states, {"n": np.int64(3)})
        c.save(1, states, {})
        c.wait()
        with pytest.raises(ValueError, match="need a sharding"):
            c.restore(abstract)  # eval_shape output alone carries no shardings
        other_bank = jax.eval_shape(lambda: bank_lib.init_bank(2, 8, 4))  # another capacity
        wrong = dict(_target_of(states), bank=_target_of(_random_like(other_bank, 0)))
        with pytest.raises(ckpt.CheckpointError, match="does not fit the restore target"):
            c.restore(wrong)
