"""The start evaluation is the same for methods that differ only in what they train (in-process,
nano models): Comp. RL, static online experience and experience only play the very same test
episodes before the first RL step, so one kept evaluation serves them all, and a copy kept under
another evaluation-relevant setting or another warm start is played again."""

import json
import shutil

import pytest

from crl_jax import trainer as trainer_lib
from crl_jax.run import evaluation
from crl_jax.run.metrics import is_machine_figure

WARM = {"warm_start/actor_loss": 0.5, "warm_start/actor_fingerprint": 1234.0, "warm_start/time_s": 9.0}


@pytest.fixture
def counted_evaluate(monkeypatch):
    calls = []
    evaluate = evaluation.Evaluator.evaluate

    def counted(self, step, salt=100):
        calls.append(salt)
        return evaluate(self, step, salt)

    monkeypatch.setattr(evaluation.Evaluator, "evaluate", counted)
    return calls


def _without_time(metrics):
    return {k: v for k, v in metrics.items() if not is_machine_figure(k)}


def test_training_switches_play_the_same_start_evaluation_and_share_it(
        make_config, tmp_path, counted_evaluate):
    comp_rl = trainer_lib.Trainer(make_config(), str(tmp_path / "crl"))
    played = comp_rl.evaluator.start_evaluation(WARM)
    assert "eval/with_exp/success" in played and counted_evaluate == [200]

    # Experience only (actor frozen) with a frozen extractor: played on its own, the very same
    # episodes, so the same figures to the last digit.
    frozen = make_config(rl={"train_actor": False}, extractor={"train": False})
    alone = trainer_lib.Trainer(frozen, str(tmp_path / "frozen")).evaluator.start_evaluation(WARM)
    assert counted_evaluate == [200, 200]
    assert _without_time(alone) == _without_time(played)

    # Given Comp. RL's kept file, it is used as it is (the warm start's time is not a key).
    shutil.copytree(tmp_path / "crl", tmp_path / "copied")
    copied = trainer_lib.Trainer(frozen, str(tmp_path / "copied"))
    assert copied.evaluator.start_evaluation({**WARM, "warm_start/time_s": 1.0}) == played
    assert counted_evaluate == [200, 200]

    # Another warm-started actor, or a setting the evaluation reads, plays it again.
    copied.evaluator.start_evaluation({**WARM, "warm_start/actor_fingerprint": 99.0})
    assert counted_evaluate == [200, 200, 200]
    shutil.copyfile(tmp_path / "crl" / evaluation.START_EVAL_FILE,
                    tmp_path / "copied" / evaluation.START_EVAL_FILE)
    more_turns = make_config(rollout={"max_turns": 3})
    trainer_lib.Trainer(more_turns, str(tmp_path / "copied")).evaluator.start_evaluation(WARM)
    assert counted_evaluate == [200, 200, 200, 200]
    assert json.loads((tmp_path / "crl" / evaluation.START_EVAL_FILE).read_text())["metrics"] == played


def test_start_eval_identity_ignores_exactly_the_training_switches(make_config):
    from crl_jax.config import to_dict

    def identity(**sections):
        return evaluation.start_eval_identity(to_dict(make_config(**sections)))

    base = identity()
    assert identity(steps=9, rl={"train_actor": False}, extractor={"train": False},
                    checkpoint={"every": 5}) == base
    for changed in ({"seed": 1}, {"eval": {"tasks_per_env": 3}}, {"memory": {"enabled": False}},
                    {"rl": {"learning_rate": 1e-3}}, {"tasks": ("minihack/room-ultimate-5x5",)}):
        assert identity(**changed) != base, changed
