"""crl_jax.sampling: batched multi-turn generation with a preallocated KV cache.

Device side (pure, jitted): `engine.generate` (prefill a chunk + `lax.while_loop` decode),
`methods` (greedy / temperature / top-k / top-p), `stops` (EOS ids, stop token sequences).
Host side: `session.Sampler` and `session.Conversations` (per-row token histories, multi-turn
continuation, overflow policies). `sizing.memory_report` sizes a run before it starts.
"""

from crl_jax.sampling.engine import SampleOutput, SamplerState, generate, init_state, jitted_generate
from crl_jax.sampling.methods import candidate_logits, choose_tokens
from crl_jax.sampling.session import Conversations, Sampler, TurnResult, shard_params
from crl_jax.sampling.sizing import kv_cache_bytes, memory_report
from crl_jax.sampling.spec import PAPER_ACTOR, PAPER_EXTRACTOR, SamplerSpec
from crl_jax.sampling.stops import FINISH_REASONS

__all__ = [
    "Conversations", "FINISH_REASONS", "PAPER_ACTOR", "PAPER_EXTRACTOR", "SampleOutput", "Sampler",
    "SamplerSpec", "SamplerState", "TurnResult", "candidate_logits", "choose_tokens", "generate",
    "init_state", "jitted_generate", "kv_cache_bytes", "memory_report", "shard_params",
]
