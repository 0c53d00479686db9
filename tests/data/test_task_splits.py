"""TFDS task splits: array_record on disk, disjoint train/test seeds, identical across builds."""

import tempfile

import pytest

from crl_jax.data import TEST_SEED_BASE, load_task_splits, task_seeds
from crl_jax.envs import make

MIX = ["sokoban/6x6-2box", "minihack/mazewalk-9x9"]


def _items(source):
    return [source[i] for i in range(len(source))]


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory):
    pytest.importorskip("minihack")
    a = load_task_splits(MIX, tmp_path_factory.mktemp("a"), num_train=12, num_test=4)
    b = load_task_splits(MIX, tmp_path_factory.mktemp("b"), num_train=12, num_test=4)
    return a, b


def test_identical_across_builds_and_disjoint(two_builds):
    a, b = two_builds
    for split in ("train", "test"):
        assert _items(a[split]) == _items(b[split])
    train = {(x["env_name"], x["seed"]) for x in _items(a["train"])}
    test = {(x["env_name"], x["seed"]) for x in _items(a["test"])}
    assert len(train) == 24 and len(test) == 8 and not (train & test)
    assert max(s for _, s in train) < TEST_SEED_BASE <= min(s for _, s in test)


def test_mixture_round_robin_and_goals_match_env(two_builds):
    a, _ = two_builds
    items = _items(a["test"])
    assert [x["env_name"] for x in items[:4]] == MIX + MIX
    assert [x["seed"] for x in items[:4]] == [TEST_SEED_BASE] * 2 + [TEST_SEED_BASE + 1] * 2
    for item in items[:4]:
        env = make(item["env_name"])
        _, info = env.reset(item["seed"])
        assert item["goal"] == info["goal"] and item["goal"]
        env.close()


def test_array_record_files_on_disk(tmp_path):
    load_task_splits("sokoban/6x6-2box", tmp_path, num_train=3, num_test=2, with_goals=False)
    files = [p.name for p in tmp_path.rglob("*") if p.is_file()]
    assert any(".array_record-" in f and "train" in f for f in files)
    assert any(".array_record-" in f and "test" in f for f in files)
    reloaded = load_task_splits("sokoban/6x6-2box", tmp_path, num_train=3, num_test=2,
                                with_goals=False)
    assert _items(reloaded["train"]) == [
        {"env_name": "sokoban/6x6-2box", "seed": s, "goal": ""} for s in range(3)]


def test_a_build_leaves_no_temporary_directory(tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    load_task_splits("sokoban/6x6-2box", tmp_path / "data", num_train=2, num_test=1,
                     with_goals=False)
    assert list(scratch.iterdir()) == []


def test_bad_arguments_are_clear(tmp_path):
    with pytest.raises(ValueError, match="unknown env names"):
        load_task_splits("chess/v1", tmp_path)
    with pytest.raises(ValueError, match="split"):
        task_seeds("validation", 3)
    assert task_seeds("test", 2) == [TEST_SEED_BASE, TEST_SEED_BASE + 1]


def test_run_task_specs_grow_with_the_evaluation_size(tmp_path):
    """Asking for more test tasks than the default 100 appends tasks: the first 100 stay the same,
    so before/after numbers of runs with different evaluation sizes share their first rooms."""
    from crl_jax.data import DEFAULT_NUM_TEST, task_specs

    default = task_specs(["sokoban/6x6-2box"], str(tmp_path), min_test=16)
    larger = task_specs(["sokoban/6x6-2box"], str(tmp_path), min_test=130)
    assert len(default["test"]) == DEFAULT_NUM_TEST == 100 and len(larger["test"]) == 130
    assert larger["test"][:DEFAULT_NUM_TEST] == default["test"]
    assert larger["train"] == default["train"]
    assert len({t["seed"] for t in larger["test"]}) == 130
