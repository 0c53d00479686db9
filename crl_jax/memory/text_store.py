"""Host-side text of the experience bank: entry id -> what the entry says and where it came from.

The device bank (`bank.py`) knows only key embeddings and counters; everything a person or the
extractor's trainer needs lives here under the same entry id: the title and content shown to the
actor, the query text that was embedded as the key, the task, and the extractor generation that
wrote it (prompt and response token ids, and the sampler's response log-probs when given), which
is the extractor's RL training sample. The whole store round-trips through plain JSON so it can
sit in the same checkpoint as the models.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence


@dataclasses.dataclass(frozen=True)
class Generation:
    """One extractor generation: exact token ids as sampled, never re-tokenised text."""
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_logprobs: tuple[float, ...] | None = None
    kind: str = "distill"          # "distill", "merge" or "refine"

    def __post_init__(self):
        object.__setattr__(self, "prompt_ids", tuple(int(t) for t in self.prompt_ids))
        object.__setattr__(self, "response_ids", tuple(int(t) for t in self.response_ids))
        if self.response_logprobs is not None:
            logprobs = tuple(float(x) for x in self.response_logprobs)
            if len(logprobs) != len(self.response_ids):
                raise ValueError(f"{len(logprobs)} response log-probs for "
                                 f"{len(self.response_ids)} response tokens")
            object.__setattr__(self, "response_logprobs", logprobs)

    def to_json(self) -> dict:
        return {"prompt_ids": list(self.prompt_ids), "response_ids": list(self.response_ids),
                "response_logprobs": None if self.response_logprobs is None
                else list(self.response_logprobs), "kind": self.kind}

    @classmethod
    def from_json(cls, d: dict) -> "Generation":
        return cls(d["prompt_ids"], d["response_ids"], d.get("response_logprobs"),
                   d.get("kind", "distill"))


def render_entry(title: str, content: str) -> str:
    """A bank entry as the actor and the extractor see it (retrieval, distillation, merge)."""
    return f"<title>{title}</title>\n<content>{content}</content>"


@dataclasses.dataclass(frozen=True)
class Entry:
    entry_id: int
    task: str
    title: str
    content: str
    query: str                      # the text whose embedding is the entry's key
    created_step: int
    generation: Generation | None = None

    def render(self) -> str:
        """The entry as the actor and the extractor see it."""
        return render_entry(self.title, self.content)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["generation"] = None if self.generation is None else self.generation.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Entry":
        gen = d.get("generation")
        return cls(int(d["entry_id"]), d["task"], d["title"], d["content"], d["query"],
                   int(d["created_step"]), None if gen is None else Generation.from_json(gen))


class TextStore:
    """Mapping entry id -> Entry. Changes go through `apply`, which is all-or-nothing."""

    def __init__(self, entries: Iterable[Entry] = ()):
        self._entries: dict[int, Entry] = {}
        for e in entries:
            if e.entry_id in self._entries:
                raise ValueError(f"duplicate entry id {e.entry_id} in text store")
            self._entries[e.entry_id] = e

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, entry_id) -> bool:
        return int(entry_id) in self._entries

    def __getitem__(self, entry_id) -> Entry:
        try:
            return self._entries[int(entry_id)]
        except KeyError:
            raise KeyError(f"entry id {entry_id} is not in the text store") from None

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries.values())

    def ids(self) -> set[int]:
        return set(self._entries)

    def get(self, entry_id, default=None):
        return self._entries.get(int(entry_id), default)

    def apply(self, remove: Sequence[int], add: Sequence[Entry]) -> None:
        """Remove then add, checking everything first so a bad request changes nothing."""
        remove = [int(i) for i in remove]
        missing = [i for i in remove if i not in self._entries]
        if missing:
            raise KeyError(f"cannot remove entry ids {missing}: not in the text store")
        kept = set(self._entries) - set(remove)
        new_ids = [e.entry_id for e in add]
        clash = [i for i in new_ids if i in kept] + [i for i in set(new_ids) if new_ids.count(i) > 1]
        if clash:
            raise ValueError(f"entry ids {sorted(set(clash))} already exist")
        for i in remove:
            del self._entries[i]
        for e in add:
            self._entries[e.entry_id] = e

    def to_json(self) -> list[dict]:
        return [e.to_json() for e in sorted(self._entries.values(), key=lambda e: e.entry_id)]

    @classmethod
    def from_json(cls, items: list[dict]) -> "TextStore":
        return cls(Entry.from_json(d) for d in items)
