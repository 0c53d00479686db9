"""The warm start inside a run: it trains before the first RL step, is evaluated, is logged and
reported, and a restart of the run reuses its cache (in-process, nano models)."""

import json

from crl_jax import trainer as trainer_lib
from crl_jax.run import episodes
from crl_jax.warm_start import params_fingerprint, summary_metrics
from tests.trainer.tiny_config import WARM


def test_warm_start_runs_before_rl_and_is_reported(make_config, tmp_path):
    cfg = make_config(**WARM)
    trainer_lib.Trainer(cfg, str(tmp_path)).run()
    with open(tmp_path / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    first = rows[0]
    assert first["step"] == 0
    # The warm start's figures and the evaluation before RL ride on the first row only.
    for key in ("warm_start/actor_loss", "warm_start/demo_success", "start/eval/without_exp/success",
                "start/eval/with_exp/success", "start/eval/without_exp/episodes",
                "warm_start/actor_fingerprint"):
        assert key in first, key
        assert all(key not in r for r in rows[1:])
    assert first["start/eval/without_exp/episodes"] == 4
    assert 0.0 <= first["warm_start/extractor_parsed"] <= 1.0   # the probe, with the run's sampler
    assert 0.0 <= first["warm_start/extractor_merge_parsed"] <= 1.0
    assert rows[-1]["eval/without_exp/episodes"] == 4          # the final evaluation
    assert "bank/retrievals" in rows[-1]
    curve = [json.loads(line) for half in ("actor", "extractor")
             for line in (tmp_path / "warm_start" / half / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in curve] == list(range(8))         # 6 actor + 2 extractor updates
    assert curve[5]["actor/loss"] < curve[0]["actor/loss"]
    # One line of sample episodes per step: an experience-free and a guided one, as text.
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [0, 1]
    assert [e["guided"] for e in samples[0]["episodes"]] == [False, True]
    assert all(e["actor"] and e["task"] == "test/corridor" for e in samples[0]["episodes"])
    # ... and the extractor's outputs that finished meanwhile, one per outcome and pass. Step 0's
    # distillation runs in the background while the actor trains, so it is written with step 0
    # if it finished first and with step 1 otherwise, never twice; step 1's may or may not have
    # finished when step 1's line is written.
    assert all(x["step"] == 0 for x in samples[0]["extractor"])
    distilled = [x for s in samples for x in s["extractor"] if x["kind"] == "distill"]
    assert {x["step"] for x in distilled} in ({0}, {0, 1})
    outcomes = [x["outcome"] for x in distilled if x["step"] == 0]
    assert len(set(outcomes)) == len(outcomes)
    assert all(rows[1].get(f"distill/{o}", 0) >= 1 for o in outcomes)  # counted in the metrics
    assert all(isinstance(x["text"], str) and 0 < x["response_tokens"] <= 16 for x in distilled)
    report = (tmp_path / "report.md").read_text()
    for section in ("## Test split before and after RL", "## Experience bank", "## Warm start"):
        assert section in report, section
    assert "extractor distillations that parse, on fresh scripted episodes" in report
    assert "extractor merges that parse, on fresh chunks of lessons" in report

    # A resumed run drops the sample lines of the steps it replays, and any torn line.
    with open(tmp_path / "samples.jsonl", "a") as f:
        f.write('{"step": 1, "epis')
    episodes.keep_samples_before(str(tmp_path / "samples.jsonl"), 1)
    assert [json.loads(line)["step"] for line in (tmp_path / "samples.jsonl").read_text().splitlines()] == [0]

    # Another start of the same run reuses the cached warm start.
    again = trainer_lib.Trainer(cfg, str(tmp_path))
    summary = again.warm_start()
    assert summary["actor"]["steps"] == 6
    # The logged fingerprint is that of the weights RL started from, which the cache gives back.
    assert first["warm_start/actor_fingerprint"] == summary["actor_fingerprint"] == \
        params_fingerprint(again.actor_state.params)
    assert f"{summary['actor_fingerprint']:012x}" in report
    for half, rows in (("actor", 6), ("extractor", 2)):                # nothing retrained
        assert len((tmp_path / "warm_start" / half / "metrics.jsonl").read_text().splitlines()) == rows

    # A sibling run given this workdir (--cache_from) takes both halves and the start evaluation
    # instead of training and playing them; the copies are its own from then on.
    sibling_dir = tmp_path / "sibling"
    sibling = trainer_lib.Trainer(cfg, str(sibling_dir), cache_from=(str(tmp_path),))
    taken = sibling.warm_start()
    assert taken["actor_fingerprint"] == first["warm_start/actor_fingerprint"]
    assert taken["extractor"]["probe"] == summary["extractor"]["probe"]
    assert not (sibling_dir / "warm_start" / "actor" / "metrics.jsonl").exists()  # not retrained
    assert (sibling_dir / "warm_start" / "actor" / "checkpoint").is_dir()
    start = sibling.evaluator.start_evaluation(summary_metrics(taken))
    # Not played again: the very figures of the first run, its wall time included.
    assert start == {k[len("start/"):]: v for k, v in first.items() if k.startswith("start/")}

    # A sibling under other warm-start settings trains its own: the digest does not match.
    other_cfg = make_config(**{**WARM, "warm_start": {**WARM["warm_start"], "actor_steps": 5}})
    other = trainer_lib.Trainer(other_cfg, str(tmp_path / "other"), cache_from=(str(tmp_path),))
    assert other.warm_start()["actor"]["steps"] == 5
    assert len((tmp_path / "other" / "warm_start" / "actor" / "metrics.jsonl").read_text().splitlines()) == 5
