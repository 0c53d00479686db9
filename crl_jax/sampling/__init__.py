"""crl_jax.sampling: batched multi-turn generation with a preallocated KV cache.

Device side (pure, jitted): `engine.generate` (prefill a chunk + `lax.while_loop` decode),
`methods` (greedy / temperature / top-k / top-p), `stops` (EOS ids, stop token sequences).
`sizing.memory_report` sizes a run before it starts. The host side, `Sampler` and the per-row
token histories of multi-turn conversations, lives in `crl_jax.rollout.conversations`.

    graphdef, params = nnx.split(models.from_pretrained(folder))
    spec = SamplerSpec(**PAPER_ACTOR, max_new_tokens=256, cache_length=4096,
                       eos_ids=cfg.eos_ids, stop_sequences=(answer_close_ids,),
                       overflow="drop_oldest")
    sampler = Sampler(graphdef, cfg, spec, mesh=mesh)
    conv = sampler.new_conversations(batch_size=128, seed=0)
    turn = conv.step(params, prompt_ids)            # per row: tokens, logprobs, finish reason
    turn = conv.step(params, env_reply_ids, active=still_running)   # prefix not recomputed

`logprobs` are log-softmax of the raw model logits (temperature 1) at the sampled tokens, the
quantity the policy ratio needs; `processed_logprobs` (opt-in) are under the distribution that
was actually sampled from.
"""

from crl_jax.sampling.engine import SampleOutput, SamplerState, generate, init_state, jitted_generate
from crl_jax.sampling.methods import candidate_logits, choose_tokens
from crl_jax.sampling.sizing import kv_cache_bytes, memory_report
from crl_jax.sampling.spec import PAPER_ACTOR, PAPER_EXTRACTOR, SamplerSpec
from crl_jax.sampling.stops import FINISH_REASONS

__all__ = [
    "FINISH_REASONS", "PAPER_ACTOR", "PAPER_EXTRACTOR", "SampleOutput", "SamplerSpec", "SamplerState",
    "candidate_logits", "choose_tokens", "generate", "init_state", "jitted_generate", "kv_cache_bytes",
    "memory_report",
]
