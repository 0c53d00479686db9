"""The report's co-evolution section: extractor updates against RL steps, the bank's movement per
step, the share of entries ever shown, and the warning when the extractor barely trained."""

import json

import pytest

from crl_jax.run import report


def write_run(folder, updates_at, extractor_train=True, steps=8, warmup=0):
    rows = []
    for step in range(steps):
        row = {"step": step, "time": float(step), "train/success": 0.5, "bank/size": 4.0 + step,
               "distill/entries_added": 1.0, "distill/entries_updated": 0.5, "bank/merge_removed": 0.0,
               "distill/entries_evicted": 0.0,
               "bank/retrieved_share": step / steps}
        if step in updates_at:
            row.update({"extractor/loss": 0.1, "extractor/samples": 16.0})
        rows.append(row)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "config.json").write_text(json.dumps({"extractor": {"train": extractor_train},
                                                    "memory": {"enabled": True, "warmup_steps": warmup}}))


@pytest.mark.parametrize("updates_at, train, warns", [
    ((1,), True, True),             # 1 of 8 steps: fewer than a quarter
    ((1, 3, 5, 7), True, False),    # half the steps
    ((), False, False),             # static experience: the extractor is meant to stay frozen
])
def test_coevolution_section(tmp_path, updates_at, train, warns):
    write_run(tmp_path, updates_at, train)
    text = open(report.write_report(str(tmp_path)), encoding="utf-8").read()
    assert f"- extractor updates: {len(updates_at)} of 8 RL steps" in text
    assert "added 1.00, updated 0.50, merged away 0.00, evicted 0.00" in text
    assert "shown to the actor at least once, at the end: 0.88" in text
    assert ("barely co-evolved" in text) is warns
    if updates_at:
        assert "16.0 generations per update" in text


def test_rl_steps_are_counted_after_the_memory_warm_up(tmp_path):
    """Steps of the memory warm-up neither retrieve nor train: 4 updates in the 6 steps after a
    warm-up of 2 are two thirds of the RL steps, not half of all steps."""
    write_run(tmp_path, (2, 3, 5, 7), warmup=2)
    text = open(report.write_report(str(tmp_path)), encoding="utf-8").read()
    assert "- extractor updates: 4 of 6 RL steps" in text and "barely co-evolved" not in text


def test_a_run_that_ends_within_the_memory_warm_up_has_no_rl_steps(tmp_path):
    write_run(tmp_path, (), steps=2, warmup=2)
    text = open(report.write_report(str(tmp_path)), encoding="utf-8").read()
    assert "- extractor updates: 0 of 0 RL steps" in text and "barely co-evolved" not in text
