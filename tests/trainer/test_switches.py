"""Each method switch of the training loop does what it says (in-process, nano models)."""

import json
import os

import jax
import numpy as np

from crl_jax import trainer as trainer_lib
from crl_jax.memory import prompts
from crl_jax.memory.text_store import Generation
from crl_jax.rollout.trajectory import EpisodeSpec

COIN = {"tasks": ("test/coin",), "steps": 4}
# Steps 1-3 retrieve (step 0 is warm-up); 6 seeded entries keep B_phi filling every step.


def seed_bank(trainer, task="test/coin", n=7):
    """One entry per coin number (the observation differs per number, so does the retrieval
    query), each from its own generation, so guided episodes retrieve several from step 1 on."""
    tok = trainer.tokenizer
    for i in range(n):
        gen = Generation(tok.encode(f"Goal: guess the coin {i}"), tok.encode(f"add lesson {i}"), None,
                         "distill")
        query = f"goal: guess the coin, observation: Coin number {i} is in the air."
        trainer.experience.manager.add_entry(task, f"lesson {i}", "say heads " * (i + 1), query, 0, gen)


def params_of(state):
    return jax.tree.map(np.asarray, jax.device_get(state.params))


def same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def logged_rows(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def updates_of(rows, model: str) -> list[dict]:
    return [r for r in rows if f"{model}/loss" in r]


def check_updated(rows, state, params_before, model: str):
    """The model was updated on some steps, and its params moved iff an advantage was non-zero."""
    updates = updates_of(rows, model)
    assert updates, f"no {model} update was logged"
    assert int(state.step) == sum(1 - r[f"{model}/skipped"] for r in updates)
    moved = not same(params_before, params_of(state))
    assert moved == any(r[f"{model}/advantage_abs_mean"] > 0 for r in updates)


def distillation_counts(stats, rows) -> tuple[int, list[float]]:
    """(distillation outputs the service parsed, those logged per row), by outcome."""
    distilled = sum(v for k, v in stats.items() if k not in ("retrievals", "retrieval_hits",
                                                             "refinements", "entries_written"))
    logged = [sum(v for k, v in r.items() if k.startswith("distill/") and k != "distill/entries_written")
              for r in rows]
    return distilled, logged


def test_complementary_rl_updates_both_models_and_uses_the_bank(make_config, tmp_path):
    trainer = trainer_lib.Trainer(make_config(**COIN), str(tmp_path))
    seed_bank(trainer)
    actor0, extractor0 = params_of(trainer.actor_state), params_of(trainer.extractor_state)
    merges = []
    original = trainer.experience.manager.merge_task
    trainer.experience.manager.merge_task = lambda *a, **k: merges.append(a[1]) or original(*a, **k)
    trainer.run()
    assert merges == [2]  # merge_every=2 over steps 0-3: step 2 only (never at step 0)
    rows = logged_rows(tmp_path)
    # The merge pass is logged on its step: one outcome per extractor call.
    merged = [r for r in rows if "bank/merge_calls" in r]
    assert [r["step"] for r in merged] == [2] and merged[0]["bank/merge_calls"] >= 1
    assert merged[0]["bank/merge_calls"] == sum(v for k, v in merged[0].items()
                                                if k.startswith("bank/merge_outcome/"))
    check_updated(rows, trainer.actor_state, actor0, "actor")
    assert not same(actor0, params_of(trainer.actor_state))  # coin outcomes vary within groups
    check_updated(rows, trainer.extractor_state, extractor0, "extractor")
    assert not any("actor/loss" in r for r in rows[:1])  # step 0 is warm-up: no update
    # The timing breakdown is logged: the update on steps that train, extractor work on every step.
    for r in rows:
        assert ("time/actor_update_s" in r) == ("actor/loss" in r or "extractor/loss" in r)
        assert 0 <= r["time/extractor_s"] <= r["time/step_s"]
        assert r.get("time/actor_update_s", 0) + r["time/actor_rollout_s"] <= r["time/step_s"]
    stats = trainer.experience.stats
    assert stats["retrievals"] > 0 and stats["retrieval_hits"] > 0
    distilled, logged = distillation_counts(stats, rows)
    assert distilled > 0
    # Every distillation outcome reaches the log once: step 1 holds step 0's background pass and
    # its own foreground one (the extractor updates from step 1 on), added, not one replacing the other.
    assert distilled == sum(logged)
    assert stats["entries_written"] == sum(r.get("distill/entries_written", 0) for r in rows)
    snapshot = trainer.experience.manager.snapshot_json()
    assert sum(e.get("retrieval_count", 0) for e in snapshot["entries"]) > 0
    assert os.path.exists(os.path.join(tmp_path, "report.md"))


def test_a_fixed_extractor_batch_keeps_the_extractor_on_steps_without_samples(make_config,
                                                                               tmp_path):
    """rl.fixed_extractor_batch, as the CPU configs run: a batch of 4 leaves steps 1 and 3 without
    extractor samples, so their updates carry the empty batch, which donates the extractor's
    unchanged state while that step's distillation runs in the background on its weights."""
    trainer = trainer_lib.Trainer(
        make_config(**COIN, rl={"fixed_extractor_batch": True}, extractor={"batch_size": 4}),
        str(tmp_path))
    assert trainer.credit.fixed_length
    seed_bank(trainer)
    # The weights each background distillation reads, checked when it is joined (after the
    # update of its step): none may have been donated while it ran.
    running, deleted = [], []
    submit, join = trainer.distillation.submit, trainer.distillation.join

    def checked_submit(params, *args, **kwargs):
        if kwargs["in_background"]:
            running.append(params)
        return submit(params, *args, **kwargs)

    def checked_join():
        if running:
            deleted.append(any(x.is_deleted() for x in jax.tree.leaves(running.pop())))
        return join()

    trainer.distillation.submit, trainer.distillation.join = checked_submit, checked_join
    extractor0 = params_of(trainer.extractor_state)
    trainer.run()
    rows = logged_rows(tmp_path)
    with_samples = [("extractor/loss" in r) for r in rows if "actor/loss" in r]
    assert False in with_samples and True in with_samples
    check_updated(rows, trainer.extractor_state, extractor0, "extractor")
    assert len(deleted) >= 2 and not any(deleted)


def test_static_online_experience_freezes_the_extractor(make_config, tmp_path):
    trainer = trainer_lib.Trainer(make_config(**COIN, extractor={"train": False}), str(tmp_path))
    seed_bank(trainer)
    actor0, extractor0 = params_of(trainer.actor_state), params_of(trainer.extractor_state)
    trainer.run()
    rows = logged_rows(tmp_path)
    assert updates_of(rows, "extractor") == [] and int(trainer.extractor_state.step) == 0
    assert same(extractor0, params_of(trainer.extractor_state))
    check_updated(rows, trainer.actor_state, actor0, "actor")
    assert trainer.experience.stats["retrieval_hits"] > 0
    # Every distillation runs in the background here, the last step's too: the final evaluation
    # waits for it, and its outcomes are logged in the last row with the rest.
    distilled, logged = distillation_counts(trainer.experience.stats, rows)
    assert distilled == sum(logged) and logged[-1] > 0


def test_experience_only_freezes_the_actor(make_config, tmp_path):
    trainer = trainer_lib.Trainer(make_config(**COIN, rl={"train_actor": False}), str(tmp_path))
    seed_bank(trainer)
    actor0, extractor0 = params_of(trainer.actor_state), params_of(trainer.extractor_state)
    trainer.run()
    rows = logged_rows(tmp_path)
    assert updates_of(rows, "actor") == [] and int(trainer.actor_state.step) == 0
    assert same(actor0, params_of(trainer.actor_state))
    check_updated(rows, trainer.extractor_state, extractor0, "extractor")


def test_grpo_baseline_has_no_retrieval_and_no_extractor(make_config, tmp_path, capsys):
    cfg = make_config(**COIN, memory={"enabled": False}, rollout={"free_per_group": 4,
                                                                  "search_and_ask": False})
    trainer = trainer_lib.Trainer(cfg, str(tmp_path))
    assert trainer.experience is None
    actor0, extractor0 = params_of(trainer.actor_state), params_of(trainer.extractor_state)
    trainer.run()
    rows = logged_rows(tmp_path)
    check_updated(rows, trainer.actor_state, actor0, "actor")
    assert not any(k.startswith(("bank/", "distill/", "eval/with_exp", "train/with_exp"))
                   for r in rows for k in r)
    assert all(r["train/without_exp/episodes"] == r["train/episodes"] for r in rows)
    assert same(extractor0, params_of(trainer.extractor_state))
    # The final evaluation shows its progress (only without experience: there is no bank).
    err = capsys.readouterr().err
    assert "eval/without_exp episodes 2/2 | elapsed" in err and "eval/with_exp episodes" not in err


def test_ablations_no_merge_no_search_and_advantage_modes(make_config, tmp_path):
    cfg = make_config(**COIN, memory={"merge_every": 0}, rollout={"search_and_ask": False},
                      rl={"advantage_split": "batch"})
    trainer = trainer_lib.Trainer(cfg, str(tmp_path))
    assert trainer.train_cfg.advantage_split == "batch"
    seed_bank(trainer)
    merges = []
    original = trainer.experience.manager.merge_task
    trainer.experience.manager.merge_task = lambda *a, **k: merges.append(a) or original(*a, **k)
    trainer.run()
    assert merges == []
    specs = [EpisodeSpec("test/coin", 1, 0, True), EpisodeSpec("test/coin", 1, 0, False)]
    trajectories, _ = trainer.rollout(specs, step=3, use_memory=True, seed=0)
    assert all(prompts.SEARCH_TOOL_TEXT not in t.messages[0]["content"] for t in trajectories)
    assert all(t.tool_calls == 0 for t in trajectories)
