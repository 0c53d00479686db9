"""Metrics logging: JSONL rows, TensorBoard events read back by TensorBoard's own reader, resume
truncation, episode aggregation, progress line, and the end-of-run report."""

import io
import json
import os
import re
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax.run import metrics as m
from crl_jax.run import report


def _rows(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _tb_scalars(workdir):
    """{tag: [(step, value)]} as TensorBoard shows it (purged events hidden), after checking every
    record's CRCs with TensorBoard's strict record reader."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow

    tb_dir = os.path.join(workdir, m.MetricsWriter.TB_DIR)
    for name in os.listdir(tb_dir):
        reader = pywrap_tensorflow.PyRecordReader_New(os.path.join(tb_dir, name).encode())
        with pytest.raises(errors.OutOfRangeError):  # reached only if every record checks out
            while True:
                reader.GetNext()
    acc = event_accumulator.EventAccumulator(tb_dir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_jsonl_and_tensorboard_rows(tmp_path):
    wd = str(tmp_path)
    with m.MetricsWriter(wd, enabled=True) as w:
        for step in (1, 2, 3):
            w.write(step, {m.TRAIN_SUCCESS: step / 4, m.BANK_SIZE: np.int32(10 * step),
                           m.ACTOR_LOSS: jnp.float32(-0.5 * step), "flag": step == 2,
                           m.EXTRACTOR_REWARD: float("nan") if step == 3 else 0.125})
            # Flushed at once: a reader sees the row before the writer is closed.
            assert _rows(wd)[-1]["step"] == step
    rows = _rows(wd)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(isinstance(r["time"], float) for r in rows)
    assert rows[1] == {**rows[1], m.TRAIN_SUCCESS: 0.5, m.BANK_SIZE: 20.0, m.ACTOR_LOSS: -1.0,
                       "flag": 1.0, m.EXTRACTOR_REWARD: 0.125}
    assert rows[2][m.EXTRACTOR_REWARD] is None  # NaN is not JSON
    tb = _tb_scalars(wd)
    assert tb[m.TRAIN_SUCCESS] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert tb[m.BANK_SIZE] == [(1, 10.0), (2, 20.0), (3, 30.0)]
    assert tb[m.ACTOR_LOSS] == [(1, -0.5), (2, -1.0), (3, -1.5)]
    assert np.isnan(tb[m.EXTRACTOR_REWARD][2][1])


def test_resume_truncates_jsonl_and_hides_stale_tensorboard_events(tmp_path):
    wd = str(tmp_path)
    w = m.MetricsWriter(wd, enabled=True)
    for step in range(1, 7):
        w.write(step, {m.TRAIN_REWARD: step})
    w.close()
    with open(os.path.join(wd, "metrics.jsonl"), "a") as f:
        f.write('{"step": 7, "ti')  # the kill landed mid-line
    w = m.MetricsWriter(wd, enabled=True)
    assert w.resume_from(4) == 3  # steps 5 and 6 and the torn line
    for step in range(5, 8):
        w.write(step, {m.TRAIN_REWARD: 100 + step})
    w.close()
    rows = _rows(wd)
    assert [(r["step"], r[m.TRAIN_REWARD]) for r in rows] == [
        (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 105.0), (6, 106.0), (7, 107.0)]
    # TensorBoard shows the same history: the first run's steps 5 and 6 are hidden, not doubled.
    assert _tb_scalars(wd)[m.TRAIN_REWARD] == [(r["step"], r[m.TRAIN_REWARD]) for r in rows]
    # A fresh start in a used workdir drops everything.
    w = m.MetricsWriter(wd, enabled=True)
    assert w.resume_from(None) == 7
    assert _rows(wd) == []
    w.write(0, {m.TRAIN_REWARD: 1.0})
    w.close()
    assert m.MetricsWriter(wd, enabled=True).resume_from(-1) == 1  # -1 also means "fresh"
    with pytest.raises(ValueError, match="non-negative integer"):
        m.MetricsWriter(wd, enabled=True).resume_from(-2)


def test_disabled_writer_writes_nothing(tmp_path):
    w = m.MetricsWriter(str(tmp_path / "run"), enabled=False)
    row = w.write(1, {m.TRAIN_SUCCESS: 1.0})
    assert row[m.TRAIN_SUCCESS] == 1.0
    assert w.resume_from(0) == 0
    w.close()
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("step,scalars,match", [
    (-1, {"a": 1.0}, "non-negative integer"),
    (1.5, {"a": 1.0}, "non-negative integer"),
    (1, {"a": "high"}, "'a' must be a real scalar"),
    (1, {"a": np.ones(3)}, "'a' must be a real scalar"),
    (1, {"step": 1.0}, "other than 'step' and 'time'"),
])
def test_bad_inputs_are_named(tmp_path, step, scalars, match):
    with pytest.raises(ValueError, match=match):
        m.MetricsWriter(str(tmp_path), enabled=True).write(step, scalars)


def test_machine_figures_are_told_from_training_figures():
    """Runs are compared with the machine's figures left out; a training figure must never be."""
    machine = ["time", m.TIME_STEP, "start/time/eval_s", "warm_start/time_s", m.HOST_RSS,
               m.HOST_MALLOC_FREE]
    training = [m.TRAIN_SUCCESS, m.EVAL_WITH_EXP_ACTIONS, m.BANK_SIZE, "warm_start/actor_loss",
                "train/success/minihack/room-ultimate-5x5", "step"]
    assert all(map(m.is_machine_figure, machine))
    assert not any(map(m.is_machine_figure, training))


def test_aggregate_episodes_means_and_per_task_breakdown():
    eps = [{"task": "door", "success": True, "actions": 4, "tool_calls": 2},
           {"task": "door", "success": False, "actions": 10},
           {"task": "key", "success": 1.0, "actions": 7, "tool_calls": 0}]
    out = m.aggregate_episodes(eps, m.EVAL_WITH_EXP)
    assert out == pytest.approx({
        "eval/with_exp/success": 2 / 3, "eval/with_exp/actions": 7.0,
        "eval/with_exp/tool_calls": 1.0, "eval/with_exp/episodes": 3.0,
        "eval/with_exp/success/door": 0.5, "eval/with_exp/actions/door": 7.0,
        "eval/with_exp/tool_calls/door": 2.0, "eval/with_exp/episodes/door": 2.0,
        "eval/with_exp/success/key": 1.0, "eval/with_exp/actions/key": 7.0,
        "eval/with_exp/tool_calls/key": 0.0, "eval/with_exp/episodes/key": 1.0})
    assert m.aggregate_episodes([], m.TRAIN) == {}
    with pytest.raises(ValueError, match="'goal' must be a real scalar"):
        m.aggregate_episodes([{"task": "door", "goal": "open it"}], m.TRAIN)


class _Clock:
    """A settable clock so ETA arithmetic is checked exactly."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_progress_lines_with_eta_and_scalars():
    clock, out = _Clock(), io.StringIO()
    p = m.Progress(100, keys=[m.TRAIN_SUCCESS, m.BANK_SIZE], every=10, stream=out, enabled=True,
                   clock=clock)
    for step in range(1, 31):
        clock.now = 5.0 + 2.0 * step  # 5 s of start-up, then 2 s per step
        p.update(step, {m.TRAIN_SUCCESS: step / 100})
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and "\r" not in out.getvalue()
    # Rate from the first update: 2 s/step; 90 steps left at step 10 -> 180 s.
    assert lines[0] == "step 10/100 | elapsed 0:00:25 | ETA 0:03:00 | train/success 0.1"
    assert lines[2].startswith("step 30/100 | elapsed 0:01:05 | ETA 0:02:20 |")


def test_progress_counts_what_its_label_names():
    clock, out = _Clock(), io.StringIO()
    p = m.Progress(96, every=1, stream=out, enabled=True, clock=clock, label="eval episodes")
    for done in (48, 96):
        clock.now = done / 4
        p.update(done)
    assert out.getvalue().splitlines() == ["eval episodes 48/96 | elapsed 0:00:12 | ETA ?",
                                           "eval episodes 96/96 | elapsed 0:00:24 | ETA 0:00:00"]


def test_progress_rewrites_one_line_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    clock, out = _Clock(), Tty()
    p = m.Progress(3, stream=out, enabled=True, clock=clock)
    for step in (1, 2, 3):
        clock.now = float(step)
        p.update(step)
    p.close()
    text = out.getvalue()
    assert text.count("\r") == 3 and text.endswith("ETA 0:00:00\n") and text.count("\n") == 1


def _synthetic_run(wd):
    with m.MetricsWriter(wd, enabled=True) as w:
        for step in range(1, 51):
            row = {m.TRAIN_SUCCESS: 0.2 + 0.01 * step, m.TRAIN_REWARD: step / 50,
                   m.TRAIN_ACTIONS: 30 - step / 5, m.BANK_SIZE: 3 * step,
                   m.TOOL_CALL_RATE: 0.5, m.EXTRACTOR_REWARD: 0.1 * (step % 7)}
            if step % 10 == 0:
                for prefix, p_success in ((m.EVAL_WITH_EXP, 0.8), (m.EVAL_WITHOUT_EXP, 0.4)):
                    eps = [{"task": t, "success": float(i < 10 * p_success), "actions": 5 + i}
                           for t in ("door", "key") for i in range(10)]
                    row.update(m.aggregate_episodes(eps, prefix))
            w.write(step, row)


def _table_row(md, name):
    match = re.search(rf"^\| `{re.escape(name)}` \| (.*) \|$", md, re.MULTILINE)
    assert match, f"no summary row for {name}"
    return [c.strip() for c in match.group(1).split("|")]


def test_report_table_and_plots(tmp_path):
    wd = str(tmp_path)
    _synthetic_run(wd)
    path = report.write_report(wd)
    md = open(path).read()
    assert _table_row(md, m.TRAIN_SUCCESS) == ["1", "0.21", "50", "0.7", "50"]
    assert _table_row(md, m.BANK_SIZE) == ["1", "3", "50", "150", "50"]
    assert _table_row(md, m.EVAL_WITH_EXP_SUCCESS) == ["10", "0.8", "50", "0.8", "5"]
    assert _table_row(md, m.EVAL_WITHOUT_EXP_ACTIONS) == ["10", "9.5", "50", "9.5", "5"]
    assert "eval/with_exp: 100 over 5 evaluations" in md
    assert "eval/without_exp: 100 over 5 evaluations" in md
    assert re.search(r"^\| door \| 0.8 \| 0.4 \| 9.5 \| 9.5 \|$", md, re.MULTILINE)
    expected = ["success.png", "reward.png", "actions.png", "bank_size.png",
                "extractor_reward.png", "tool_call_rate.png"]
    for png in expected:
        assert f"]({png})" in md
        with open(os.path.join(wd, png), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert not os.path.exists(os.path.join(wd, "timing.png"))  # no time/* keys were logged
    assert "timing.png" not in md


def test_report_cli(tmp_path):
    wd = str(tmp_path)
    with m.MetricsWriter(wd, enabled=True) as w:
        w.write(1, {m.TRAIN_SUCCESS: 0.0})
        w.write(2, {m.TRAIN_SUCCESS: 0.5})
    env = {**os.environ, "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, "-m", "crl_jax.run.report", wd], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "| `train/success` | 1 | 0 | 2 | 0.5 | 2 |" in open(os.path.join(wd, "report.md")).read()


def test_report_cli_without_log_says_so_in_one_line(tmp_path, capsys):
    assert report.main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "no metrics log" in err


def test_report_before_after_gives_the_change_and_its_standard_error(tmp_path):
    wd = str(tmp_path)
    before = m.aggregate_episodes([{"task": "door", "success": float(i < 25), "actions": 4}
                                   for i in range(100)], m.EVAL_WITHOUT_EXP)
    after = m.aggregate_episodes([{"task": "door", "success": float(i < 50), "actions": 3}
                                  for i in range(100)], m.EVAL_WITHOUT_EXP)
    with m.MetricsWriter(wd, enabled=True) as w:
        w.write(0, {m.TRAIN_SUCCESS: 0.2, **{f"{m.START}/{k}": v for k, v in before.items()}})
        w.write(1, {m.TRAIN_SUCCESS: 0.4, **after})
    md = open(report.write_report(wd)).read()
    # sqrt(0.25 * 0.75 / 100 + 0.5 * 0.5 / 100) = 0.0661
    assert _table_row(md, m.EVAL_WITHOUT_EXP) == ["0.25", "4", "100", "1", "0.5", "3", "100", "+0.250 ± 0.066"]


def test_report_sums_merge_calls_and_their_outcomes(tmp_path):
    wd = str(tmp_path)
    with m.MetricsWriter(wd, enabled=True) as w:
        w.write(0, {m.BANK_SIZE: 6.0})
        w.write(5, {m.BANK_SIZE: 4.0, "bank/merge_calls": 3.0, "bank/merge_removed": 3.0,
                    "bank/merge_written": 1.0, "bank/merge_outcome/ok": 1.0, "bank/merge_outcome/return": 2.0})
        w.write(10, {m.BANK_SIZE: 4.0, "bank/merge_calls": 2.0, "bank/merge_removed": 0.0,
                     "bank/merge_written": 0.0, "bank/merge_outcome/no_items": 2.0})
    md = open(report.write_report(wd)).read()
    assert ("- merge calls: 5 (by outcome: no_items 2, ok 1, return 2); entries merged away: 3, "
            "written: 1") in md
