"""The extractor as a text-in, generation-out service for the host loop.

Distillation, merge and search-and-ask refinement all reduce to "generate a reply to each of these
chat conversations". Every reply comes back with its `Generation` (exact prompt and response ids
and the sampler's log-probs), which is what later becomes the extractor's training sample.
"""

from __future__ import annotations

from collections.abc import Sequence

from crl_jax.memory.text_store import Generation
from crl_jax.rollout.conversations import Sampler
from crl_jax.shapes import pow2_bucket
from crl_jax.tokenizer import Tokenizer


# Tokens of the user message kept with the system message when a prompt is cut: its opening
# (the distillation prompt's "## Outcome" line).
_USER_OPENING = 24


def fit_prompt(ids: list[int], room: int, head: int | None = None) -> list[int]:
    """`ids` cut to at most `room` tokens. Long transcripts lose their middle: the instructions at
    the start (the first `head` tokens, at most two thirds of `room`; default a third) and the most
    recent turns plus the generation prompt at the end matter most."""
    if len(ids) <= room:
        return ids
    head = room // 3 if head is None else min(head, 2 * room // 3)
    return ids[:head] + ids[len(ids) - (room - head):]


def prompt_ids(tokenizer: Tokenizer, messages: Sequence[dict], room: int) -> list[int]:
    """The extractor's prompt for `messages`, cut to `room` tokens keeping the whole system
    message (the task instructions) and the opening of the user message when they fit."""
    ids = tokenizer.encode_chat(messages, add_generation_prompt=True).ids.tolist()
    system = len(tokenizer.encode_turn(messages[0])[0]) if messages and messages[0]["role"] == "system" else 0
    return fit_prompt(ids, room, head=system + _USER_OPENING)


class ExtractorClient:
    """Batched generation with the extractor's sampler; `params` are passed per call."""

    def __init__(self, sampler: Sampler, tokenizer: Tokenizer, min_batch: int = 1):
        self.sampler = sampler
        # Every call is padded to at least this many rows (then to a power of two), so the
        # distillation, merge and refinement calls of a run share one compiled program per
        # prompt length instead of one per batch size.
        self.min_batch = min_batch
        self.tokenizer = tokenizer
        self.calls = 0
        self.generated_tokens = 0

    def _prompt(self, messages: Sequence[dict]) -> list[int]:
        return prompt_ids(self.tokenizer, messages,
                          self.sampler.spec.cache_length - self.sampler.spec.max_new_tokens)

    def generate(self, params, conversations: Sequence[Sequence[dict]], seed: int,
                 kind: str) -> list[tuple[str, Generation]]:
        if not conversations:
            return []
        prompts = [self._prompt(m) for m in conversations]
        # Pad the batch to a power of two so the compiled sampler is reused across calls.
        padded = prompts + [prompts[0]] * (pow2_bucket(max(len(prompts), self.min_batch)) - len(prompts))
        result = self.sampler.generate(params, padded, seed=seed)
        self.calls += 1
        out = []
        for b, prompt in enumerate(prompts):
            response = [int(t) for t in result.tokens[b]]
            self.generated_tokens += len(response)
            text = self.tokenizer.decode(response, skip_special_tokens=True)
            out.append((text, Generation(prompt, response, result.logprobs[b].tolist(), kind)))
        return out
