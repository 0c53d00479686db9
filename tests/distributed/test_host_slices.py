"""The pieces that make a host's slice of a batch behave like the whole batch: per-row sampling
keys from global row indices, and "shown" counts queued during a rollout and replayed later."""

import jax
import numpy as np
from flax import nnx

from crl_jax import models
from crl_jax.memory.manager import MemoryConfig, MemoryManager
from crl_jax.memory.search import SearchConfig, jit_bank_fns
from crl_jax.rollout.conversations import Sampler
from crl_jax.sampling import SamplerSpec


def test_a_slice_of_the_batch_samples_what_the_whole_batch_does():
    cfg = models.get_preset("nano", vocab_size=64, eos_token_id=1, pad_token_id=0)
    graphdef, params = nnx.split(models.Decoder(cfg, rngs=nnx.Rngs(0)))
    sampler = Sampler(graphdef, cfg, SamplerSpec(method="sample", temperature=1.0, top_k=0, top_p=1.0,
                                                 max_new_tokens=6, eos_ids=(1,), cache_length=32))
    prompts = [[5 + b, 7, 9 + b] for b in range(8)]
    whole = sampler.new_conversations(8, seed=3).step(params, prompts)
    part = sampler.new_conversations(4, seed=3, first_row=4).step(params, prompts[4:])
    for b in range(4):
        np.testing.assert_array_equal(part.tokens[b], whole.tokens[4 + b])
        np.testing.assert_allclose(part.logprobs[b], whole.logprobs[4 + b], rtol=1e-5, atol=1e-6)
    # and rows really draw different tokens: identical prompts at different rows differ somewhere
    same = sampler.new_conversations(8, seed=3).step(params, [[5, 7, 9]] * 8)
    assert len({tuple(t) for t in same.tokens}) > 1


def fake_embed(texts):
    out = np.zeros((len(texts), 8), np.float32)
    for i, t in enumerate(texts):
        out[i, hash(t) % 8] = 1.0
    return out


def test_deferred_marks_replay_to_the_same_bank():
    fns = jit_bank_fns(SearchConfig(1, 4, 0.0, 1, 1.0, 0.0), None)
    direct, deferred = (MemoryManager(MemoryConfig(("a",), 8, 8), fns, fake_embed) for _ in range(2))
    for m in (direct, deferred):
        ids = [m.add_entry("a", f"t{i}", f"c{i}", f"q{i}", 0) for i in range(3)]
    direct.mark_shown([ids[0], ids[2]], 4)
    direct.mark_shown([ids[2]], 5)
    with deferred.deferred_marks() as queue:
        deferred.mark_shown([ids[0], ids[2]], 4)
        deferred.mark_shown([ids[2]], 5)
        np.testing.assert_array_equal(deferred.bank.retrieval_count, 0)  # nothing written yet
    assert queue == [([ids[0], ids[2]], 4), ([ids[2]], 5)]
    for entry_ids, step in queue:
        deferred.mark_shown(entry_ids, step)
    for a, b in zip(jax.tree.leaves(direct.bank), jax.tree.leaves(deferred.bank)):
        np.testing.assert_array_equal(a, b)
    assert int(np.asarray(direct.bank.retrieval_count).sum()) == 3
