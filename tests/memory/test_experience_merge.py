"""The experience service's merge pass reports what it did: one count per extractor call, the
entries merged away and written, and each call's parse outcome."""

from crl_jax.memory.manager import MemoryConfig, MemoryManager
from crl_jax.memory.text_store import Generation
from crl_jax.rollout.experience import ExperienceService


class ScriptedExtractor:
    """Replays replies in order (the service's extractor interface: generate(params,
    conversations, seed, kind) -> [(text, generation)]), each with a generation of its own."""

    def __init__(self, replies):
        self.replies, self.kinds, self.made = list(replies), [], []

    def generate(self, params, conversations, *, seed, kind):
        self.kinds.append(kind)
        out = []
        for _ in conversations:
            self.made.append(Generation([900 + len(self.made)], [2], kind=kind))
            out.append((self.replies.pop(0), self.made[-1]))
        return out


def _item(title, content):
    return f"<<<KNOWLEDGE_ITEM>>>\n<title>{title}</title>\n<content>{content}</content>\n<<<END_ITEM>>>"


def test_merge_counts_calls_entries_and_outcomes(bank_fns, hash_embed):
    manager = MemoryManager(MemoryConfig(tasks=("room", "maze"), capacity=32, dim=16, merge_every=5,
                                         merge_chunk=3), bank_fns, hash_embed)
    for i in range(6):                                      # room: chunks [0-2], [3-5]
        manager.add_entry("room", f"R{i}", f"room lesson {i}", f"q{i}", 0)
    for i in range(2):                                      # maze: one chunk
        manager.add_entry("maze", f"M{i}", f"maze lesson {i}", f"m{i}", 0)
    manager.distill("room", "q", "not an operation", [], 1)  # a distillation reason, not a merge's
    extractor = ScriptedExtractor([_item("R", "room lessons 0-2"),  # room chunk 1: 3 -> 1
                                   "<content>half an item",         # room chunk 2: kept
                                   "<<<RETURN>>>"])                 # maze: kept
    service = ExperienceService(manager, extractor, seed=0)

    assert service.merge(params=None, step=4) == {"calls": 0, "removed": 0, "written": 0}
    counts = service.merge(params=None, step=5)
    assert counts == {"calls": 3, "removed": 3, "written": 1, "outcome/ok": 1, "outcome/no_items": 1,
                      "outcome/return": 1}
    assert extractor.kinds == ["merge"] * 3
    # One kept output per outcome of the pass, labelled with the manager's own parse outcome.
    samples = service.take_output_samples()
    assert [(x["kind"], x["step"], x["outcome"]) for x in samples] == [
        ("merge", 5, "ok"), ("merge", 5, "no_items"), ("merge", 5, "return")]
    assert samples[1]["text"] == "<content>half an item" and samples[1]["response_tokens"] == 1
    assert service.take_output_samples() == []
    assert sorted(e.title for e in manager.store if e.task == "room") == ["R", "R3", "R4", "R5"]
