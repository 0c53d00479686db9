"""A SIGTERM before the first RL step (in-process, nano models, real signals): the run stops after
the warm-start half or the start evaluation the signal arrives in, keeps it in the workdir, and the
same run started again goes on from there without redoing it."""

import json
import os
import signal

import pytest

from crl_jax.run import graceful_stop
from crl_jax import trainer as trainer_lib
from crl_jax.run import evaluation
from crl_jax import warm_start as warm_start_lib

from tests.trainer.tiny_config import WARM


class SignalNotHandled(Exception):
    pass


def _unhandled(signum, frame):
    raise SignalNotHandled(signal.Signals(signum).name)


@pytest.fixture
def sigterm_handler():
    # Outside the run's StopRequests a SIGTERM raises here instead of ending the test process.
    previous = signal.signal(signal.SIGTERM, _unhandled)
    yield
    signal.signal(signal.SIGTERM, previous)


def _rows(workdir):
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_sigterm_in_the_actor_half_stops_after_it_and_the_rerun_trains_only_the_extractor(
        make_config, tmp_path, monkeypatch, sigterm_handler):
    cfg = make_config(**WARM)
    train_actor = warm_start_lib._train_actor

    def actor_half_then_sigterm(*args, **kwargs):
        out = train_actor(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # a preemption notice while the actor trains
        return out

    monkeypatch.setattr(warm_start_lib, "_train_actor", actor_half_then_sigterm)
    with pytest.raises(graceful_stop.Stopped) as stopped:
        trainer_lib.Trainer(cfg, str(tmp_path)).run()
    assert stopped.value.signum == signal.SIGTERM and stopped.value.next_step == 0
    assert "before the first RL step" in str(stopped.value)
    assert len(_rows(tmp_path / "warm_start" / "actor")) == 6          # the actor half is kept
    assert _rows(tmp_path / "warm_start" / "extractor") == []          # not started
    assert not os.listdir(tmp_path / "warm_start" / "extractor" / "checkpoint")
    assert _rows(tmp_path) == [] and not os.listdir(tmp_path / "checkpoints")
    assert not (tmp_path / "report.md").exists()

    monkeypatch.setattr(warm_start_lib, "_train_actor", train_actor)
    trainer_lib.Trainer(cfg, str(tmp_path)).run()
    assert len(_rows(tmp_path / "warm_start" / "actor")) == 6          # not trained again
    assert len(_rows(tmp_path / "warm_start" / "extractor")) == 2
    assert [r["step"] for r in _rows(tmp_path)] == [0, 1]
    assert "start/eval/with_exp/success" in _rows(tmp_path)[0]
    assert (tmp_path / "report.md").exists()


def test_sigterm_in_the_start_evaluation_stops_after_it_and_the_rerun_reuses_it(
        make_config, tmp_path, monkeypatch, sigterm_handler):
    cfg = make_config(**WARM)
    evaluate = evaluation.Evaluator.evaluate
    calls = []

    def evaluate_then_sigterm(self, step, salt=100):
        calls.append(salt)
        out = evaluate(self, step, salt)
        if salt == 200:  # the start evaluation
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(evaluation.Evaluator, "evaluate", evaluate_then_sigterm)
    with pytest.raises(graceful_stop.Stopped) as stopped:
        trainer_lib.Trainer(cfg, str(tmp_path)).run()
    assert stopped.value.next_step == 0 and calls == [200]
    kept = json.loads((tmp_path / evaluation.START_EVAL_FILE).read_text())["metrics"]
    assert kept["eval/without_exp/episodes"] == 4
    assert _rows(tmp_path) == [] and not os.listdir(tmp_path / "checkpoints")

    def evaluate_counted(self, step, salt=100):
        calls.append(salt)
        return evaluate(self, step, salt)

    monkeypatch.setattr(evaluation.Evaluator, "evaluate", evaluate_counted)
    rerun = trainer_lib.Trainer(cfg, str(tmp_path))
    rerun.run()
    assert calls == [200, 100]                       # only the final evaluation was played again
    first = _rows(tmp_path)[0]
    assert {k: first[f"start/{k}"] for k in kept} == kept
    assert [r["step"] for r in _rows(tmp_path)] == [0, 1]

    # A start evaluation kept under another warm start (or configuration) is played again.
    rerun.evaluator.start_evaluation({"warm_start/actor_loss": -1.0})
    assert calls == [200, 100, 200]
    (tmp_path / evaluation.START_EVAL_FILE).write_text('{"digest": ')   # not one it wrote
    assert rerun.evaluator.start_evaluation({})["eval/without_exp/episodes"] == 4
    assert calls == [200, 100, 200, 200]
