"""Manager: retrieval with counting, chunked sliding merge, checkpoint state round trip, show."""
import json
import subprocess
import sys

import jax
import numpy as np

from crl_jax.memory import prompts
from crl_jax.memory.manager import MemoryConfig, MemoryManager
from crl_jax.memory.text_store import Generation


def _manager(bank_fns, hash_embed, **kw):
    return MemoryManager(MemoryConfig(tasks=("room", "maze"), capacity=32, dim=16, **kw), bank_fns, hash_embed)


def test_retrieve_finds_own_task_and_counts_only_marked(bank_fns, hash_embed):
    mgr = _manager(bank_fns, hash_embed)
    a = mgr.add_entry("room", "A", "open doors", "goal: exit room", 0)
    b = mgr.add_entry("maze", "B", "follow walls", "goal: exit room", 0)   # same key, other task
    mgr.add_entry("room", "C", "other", "goal: find key", 0)
    got = mgr.retrieve(["goal: exit room", "goal: exit room"], ["room", "maze"], 1, jax.random.key(0))
    assert [e.entry_id for e in got[0]][:1] == [a] and [e.entry_id for e in got[1]] == [b]
    bank = jax.device_get(mgr.bank)
    assert bank.retrieval_count.sum() == 0, "searching alone records nothing"
    mgr.mark_shown([a, a, b], 1)
    counts = {e["entry_id"]: e["retrieval_count"] for e in mgr.snapshot_json()["entries"]}
    assert counts[a] == 2 and counts[b] == 1


def test_generation_is_kept_with_the_entry(bank_fns, hash_embed):
    mgr = _manager(bank_fns, hash_embed)
    gen = Generation([1, 2, 3], [4, 5], [-0.1, -0.2])
    reason, ids = mgr.distill("room", "q", "<answer>add(<title>t</title><content>c</content>)</answer>", [], 3, gen)
    assert reason == "ok" and mgr.store[ids[0]].generation == gen
    assert mgr.store[ids[0]].query == "q" and mgr.store[ids[0]].created_step == 3


def test_stale_target_changes_nothing(bank_fns, hash_embed):
    mgr = _manager(bank_fns, hash_embed)
    a = mgr.add_entry("room", "A", "x", "q", 0)
    mgr.delete_entries([a], 1)
    reason, ids = mgr.distill("room", "q", "<answer>update([1], <title>t</title><content>c</content>)</answer>", [a], 2)
    assert reason == "stale_target" and ids == [] and len(mgr.store) == 0


def _merge_script(outputs):
    """A deterministic merge generator: replays `outputs`, recording the prompts it was shown."""
    seen = []

    def generate(messages):
        seen.append(messages[1]["content"])
        return outputs[len(seen) - 1], Generation([7], [8], kind="merge")
    return generate, seen


def _item(t, c):
    return f"<<<KNOWLEDGE_ITEM>>>\n<title>{t}</title>\n<content>{c}</content>\n<<<END_ITEM>>>"


def test_sliding_merge_carries_output_into_next_chunk(bank_fns, hash_embed):
    mgr = _manager(bank_fns, hash_embed, merge_every=5, merge_chunk=5)
    ids = [mgr.add_entry("room", f"T{i}", f"lesson {i}", f"q{i}", 0) for i in range(12)]
    other = mgr.add_entry("maze", "M", "maze lesson", "qm", 0)
    generate, seen = _merge_script([_item("M1", "merged 0-4"),
                                    _item("M2", "merged M1+5-9") + _item("M3", "kept"),
                                    "<<<RETURN>>>"])
    assert mgr.maybe_merge(4, generate) == {}
    result = mgr.merge_task("room", 5, generate)
    assert len(seen) == 3
    assert "Memory Entry 1:\n<title>M1</title>" in seen[1] and "lesson 5" in seen[1]
    assert "Memory Entry 6:" in seen[1] and "Memory Entry 7:" not in seen[1]
    assert "Memory Entry 1:\n<title>M2</title>" in seen[2] and "lesson 10" in seen[2]
    # Chunks 1-2 merged into M2, M3; the last call kept its chunk (lessons 10, 11) and the carry.
    assert result == (10, 2)
    room = sorted((e.title for e in mgr.store if e.task == "room"))
    assert room == ["M2", "M3", "T10", "T11"] and other in mgr.store
    m2 = next(e for e in mgr.store if e.title == "M2")
    assert m2.generation.kind == "merge" and m2.query == "M2\nmerged M1+5-9"
    assert mgr.reasons["merge_ok"] == 2 and mgr.reasons["merge_return"] == 1
    assert set(ids[10:]) <= mgr.store.ids() and not set(ids[:10]) & mgr.store.ids()


def test_bad_merge_output_keeps_everything(bank_fns, hash_embed):
    mgr = _manager(bank_fns, hash_embed, merge_chunk=3)
    ids = [mgr.add_entry("room", f"T{i}", f"lesson {i}", f"q{i}", 0) for i in range(3)]
    generate, _ = _merge_script([_item("a", "b") * 4])             # more items than inputs
    assert mgr.merge_task("room", 5, generate) == (0, 0)
    assert mgr.store.ids() == set(ids) and mgr.reasons["merge_too_many_items"] == 1


def test_state_round_trip_and_show(bank_fns, hash_embed, tmp_path):
    mgr = _manager(bank_fns, hash_embed)
    mgr.add_entry("room", "Doors", "try the door first", "goal: exit", 0, Generation([1], [2]))
    mgr.add_entry("maze", "Walls", "keep a hand on the wall", "goal: maze", 1)
    mgr.distill("room", "q", "garbage", [], 2)
    bank, state = mgr.state()
    state = json.loads(json.dumps(state))
    fresh = _manager(bank_fns, hash_embed)
    fresh.restore(jax.device_get(bank), state)
    assert fresh.store.to_json() == mgr.store.to_json() and fresh.reasons == mgr.reasons
    np.testing.assert_array_equal(np.asarray(fresh.bank.keys), np.asarray(mgr.bank.keys))
    path = tmp_path / "bank.json"
    path.write_text(json.dumps(mgr.snapshot_json()))
    out = subprocess.run([sys.executable, "-m", "crl_jax.memory.show", str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert "== task room: 1 entries, 0 retrievals ==" in out and "keep a hand on the wall" in out
    assert "no_answer: 1" in out
    # A training checkpoint folder: the bank sits inside the host state Orbax writes.
    from crl_jax.run.checkpoint import Checkpointer

    ckpt = Checkpointer(str(tmp_path / "run" / "checkpoints"), max_to_keep=1, async_save=False)
    ckpt.save(3, {"x": np.zeros(2, np.float32)}, {"next_step": 4, "memory": state})
    ckpt.wait()
    ckpt.close()
    out = subprocess.run([sys.executable, "-m", "crl_jax.memory.show", str(tmp_path / "run")],
                         capture_output=True, text=True, check=True).stdout
    assert "== task maze: 1 entries, retrieval counts not in this file ==" in out
    assert "keep a hand on the wall" in out


def test_prompts_strip_injection_and_number_entries():
    system = prompts.inject_experience("You are an agent.", "<title>t</title><content>c</content>")
    assert "<content>c</content>" in system and prompts.strip_injection(system) == "You are an agent."
    msgs = prompts.distill_messages(False, [{"role": "system", "content": system},
                                           {"role": "assistant", "content": "go north"}],
                                    ["first", "second"])
    user = msgs[1]["content"]
    assert "FAILURE" in user and "<content>c</content>" not in user and "[Agent]\ngo north" in user
    assert "Memory Entry 1:\nfirst" in user and "Memory Entry 2:\nsecond" in user
    assert prompts.NO_MEMORIES in prompts.distill_messages(True, [], [])[1]["content"]


def test_donating_bank_functions_work_on_a_fresh_bank(hash_embed):
    from crl_jax.memory.search import SearchConfig, jit_bank_fns
    fns = jit_bank_fns(SearchConfig(k=1), donate=True)
    mgr = MemoryManager(MemoryConfig(tasks=("t",), capacity=4, dim=16), fns, hash_embed)
    a = mgr.add_entry("t", "A", "x", "q", 0)
    mgr.mark_shown([a], 1)
    mgr.mark_trained([a], 2)
    row = mgr.snapshot_json()["entries"][0]
    assert (row["retrieval_count"], row["train_count"]) == (1, 1)


def test_merge_is_dropped_when_its_entries_change_meanwhile(bank_fns, hash_embed):
    mgr = _manager(bank_fns, hash_embed, merge_chunk=5)
    ids = [mgr.add_entry("room", f"T{i}", f"lesson {i}", f"q{i}", 0) for i in range(3)]

    def generate(messages):          # another writer deletes an entry while the merge generates
        mgr.delete_entries([ids[0]], 5)
        return _item("M", "merged"), None

    assert mgr.merge_task("room", 5, generate) == (0, 0)
    assert mgr.store.ids() == set(ids[1:]) and mgr.reasons["merge_stale"] == 1


def test_concurrent_distill_and_retrieve(bank_fns, hash_embed):
    import threading
    mgr = _manager(bank_fns, hash_embed)
    mgr.add_entry("room", "seed", "s", "goal", 0)
    errors = []

    def writer():
        try:
            for i in range(40):
                mgr.distill("room", f"q{i % 7}", f"<answer>add(<title>t{i}</title><content>c</content>)</answer>", [], i)
        except Exception as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    thread = threading.Thread(target=writer)
    thread.start()
    for i in range(40):
        for row in mgr.retrieve(["goal", "q3"], ["room", "room"], i, jax.random.key(i)):
            mgr.mark_shown([e.entry_id for e in row], i)
    thread.join()
    assert not errors
    bank = jax.device_get(mgr.bank)
    assert set(bank.entry_id[bank.valid].tolist()) == mgr.store.ids() and len(mgr.store) == 32
