"""B_phi: the extractor's training buffer, keyed by generation.

The reward unit is an extractor generation whose output the actor used: the generation that wrote
an injected entry (distillation or merge), or a search-and-ask refinement. Each use adds the
episode's outcome as +1 (success) or -1 (failure); the sample's reward is the mean over its uses.
Samples leave in first-in-first-out order once the buffer holds a full batch. The whole buffer is
JSON, so it is saved in the checkpoint and a resumed run trains on exactly the same samples.
"""

from __future__ import annotations

import collections
import dataclasses

from crl_jax.memory.text_store import Generation


def generation_key(gen: Generation) -> str:
    """Deterministic identity of a generation (the same text in two processes gives the same key)."""
    import hashlib

    digest = hashlib.sha1()
    digest.update(gen.kind.encode())
    digest.update(b"|".join(str(t).encode() for t in gen.prompt_ids))
    digest.update(b"#")
    digest.update(b"|".join(str(t).encode() for t in gen.response_ids))
    return digest.hexdigest()


@dataclasses.dataclass
class BufferedSample:
    generation: Generation
    reward_sum: float = 0.0
    uses: int = 0
    entry_ids: set[int] = dataclasses.field(default_factory=set)

    @property
    def reward(self) -> float:
        return self.reward_sum / max(self.uses, 1)


class RewardBuffer:
    def __init__(self):
        self._samples: collections.OrderedDict[str, BufferedSample] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._samples)

    def add_use(self, gen: Generation, success: bool, entry_id: int | None = None) -> None:
        key = generation_key(gen)
        sample = self._samples.get(key)
        if sample is None:
            sample = self._samples[key] = BufferedSample(gen)
        sample.reward_sum += 1.0 if success else -1.0
        sample.uses += 1
        if entry_id is not None:
            sample.entry_ids.add(int(entry_id))

    def pop_batch(self, size: int) -> list[BufferedSample] | None:
        """The oldest `size` samples, removed; None while the buffer holds fewer."""
        if len(self._samples) < size:
            return None
        return [self._samples.popitem(last=False)[1] for _ in range(size)]

    def to_json(self) -> list[dict]:
        return [{"generation": s.generation.to_json(), "reward_sum": s.reward_sum, "uses": s.uses,
                 "entry_ids": sorted(s.entry_ids)} for s in self._samples.values()]

    @classmethod
    def from_json(cls, items: list[dict]) -> "RewardBuffer":
        """The buffer `to_json` wrote; ValueError names what is wrong with anything else."""
        buffer = cls()
        try:
            for item in items:
                gen = Generation.from_json(item["generation"])
                sample = BufferedSample(gen, float(item["reward_sum"]), int(item["uses"]),
                                        {int(i) for i in item["entry_ids"]})
                if sample.uses < 1 or not abs(sample.reward_sum) <= sample.uses:
                    raise ValueError(f"reward sum {sample.reward_sum} over {sample.uses} uses of +-1")
                buffer._samples[generation_key(gen)] = sample
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"the extractor's reward buffer is malformed ({type(err).__name__}: {err})") from None
        return buffer
