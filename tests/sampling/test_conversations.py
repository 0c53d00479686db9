"""Stops, sampling and overflow policies on a real (tiny random) model, through the host API."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from flax import nnx  # noqa: E402

from crl_jax import sampling  # noqa: E402
from crl_jax.sampling import engine  # noqa: E402
from crl_jax.sampling import stops  # noqa: E402
from crl_jax.rollout import conversations  # noqa: E402
from tests.sampling.conftest import random_prompts  # noqa: E402
from tests.sampling.test_generate_hf import hf_logprobs  # noqa: E402
from tests.sampling.test_methods import allowed_set  # noqa: E402


def make_sampler(model, **spec):
    graphdef, params = nnx.split(model)
    return conversations.Sampler(graphdef, model.config, sampling.SamplerSpec(**spec)), params


def test_eos_and_stop_sequences_stop_exactly(make_pair):
    _, model = make_pair("qwen2")
    prompts = random_prompts(np.random.default_rng(4), (5, 8, 3, 6))
    # The same spec as the multi-turn test, so that its compiled program is reused.
    base, params = make_sampler(model, max_new_tokens=6, cache_length=64)
    full = [list(t) for t in base.generate(params, prompts).tokens]
    # Stops chosen from the unconstrained outputs so that they are actually hit mid-generation.
    spec = base.spec.replace(stop_sequences=(tuple(full[0][2:4]),), eos_ids=(full[1][3],))
    sampler = conversations.Sampler(base.graphdef, model.config, spec)
    conv = sampler.new_conversations(4)
    result = conv.step(params, prompts)
    for b in range(4):
        cut = stops.match_stop_sequences_np(full[b], spec)
        want = full[b][:cut] if cut else full[b]
        assert list(result.tokens[b]) == want, b
        reason = ("max_new_tokens" if cut is None else
                  "eos" if want[-1] in spec.eos_ids else "stop_sequence")
        assert result.finish_reasons[b] == reason
        # A finished row stopped advancing its cache: prompt + all generated but the last token.
        assert conv.cached_length(b) == len(prompts[b]) + len(want) - 1
    assert len(result.tokens[0]) <= 4 and len(result.tokens[1]) <= 4


def test_top_k_top_p_sampling_on_the_model_is_reproducible_and_allowed(make_pair):
    torch_model, model = make_pair("llama")
    prompts = random_prompts(np.random.default_rng(5), (4, 7, 2))
    sampler, params = make_sampler(model, method="sample", temperature=0.99, top_k=5, top_p=0.9,
                                   max_new_tokens=8, cache_length=32)
    first = sampler.generate(params, prompts, seed=11)
    again = sampler.generate(params, prompts, seed=11)
    other = sampler.generate(params, prompts, seed=12)
    assert all(np.array_equal(a, b) for a, b in zip(first.tokens, again.tokens))
    assert not all(np.array_equal(a, b) for a, b in zip(first.tokens, other.tokens))
    for result in (first, other):
        for b, p in enumerate(prompts):
            sequence = p + list(result.tokens[b])
            logprobs = hf_logprobs(torch_model, sequence)
            for i, token in enumerate(result.tokens[b]):
                position = len(p) + i - 1
                assert int(token) in allowed_set(logprobs[position], 0.99, 5, 0.9), (b, i)
                np.testing.assert_allclose(result.logprobs[b][i], logprobs[position, token], atol=1e-4)


def _run_turns(sampler, params, turns):
    """Prompt lengths (6, 4); each turn appends 4 tokens to row 0 and 1 token to row 1."""
    rng = np.random.default_rng(6)
    conv = sampler.new_conversations(2)
    conv.step(params, random_prompts(rng, (6, 4)))
    for _ in range(turns):
        result = conv.step(params, random_prompts(rng, (4, 1)))
    return conv, result


def test_overflow_error_names_the_row_and_lengths(make_pair):
    _, model = make_pair("qwen2")
    sampler, params = make_sampler(model, max_new_tokens=6, cache_length=40, overflow="error")
    _run_turns(sampler, params, 2)  # 32 tokens of row 0 fit
    with pytest.raises(ValueError, match=r"row 0: 31 tokens cached \+ 5 to append .* = 41 slots > "
                                         r"cache_length 40"):
        _run_turns(sampler, params, 3)


def test_overflow_drop_oldest_keeps_the_prompt_and_reprefills(make_pair):
    _, model = make_pair("qwen2")
    sampler, params = make_sampler(model, max_new_tokens=6, cache_length=40, overflow="drop_oldest")
    conv, result = _run_turns(sampler, params, 3)
    assert result.reprefilled_rows == [0]
    assert conv.dropped_tokens == [10, 0]  # the first response (6) and the env reply after it (4)
    # The re-prefilled row continues exactly like a fresh run over the kept history.
    for b in range(2):
        history = conv.history(b)
        response = list(result.tokens[b])
        assert history[-len(response):] == response
        fresh = sampler.generate(params, [history[:-len(response)]])
        assert list(fresh.tokens[0]) == response
    assert conv.cached_length(0) == len(conv.history(0)) - 1 <= 40


def test_a_growing_cache_samples_what_a_whole_cache_does(make_pair):
    """A cache that starts at 8 slots and doubles as the turns need samples the same tokens as
    one of the spec's whole 40 slots from the start, with log-probs equal to float rounding (a
    softmax over more masked slots may add them up in another order)."""
    _, model = make_pair("qwen2")
    graphdef, params = nnx.split(model)
    spec = sampling.SamplerSpec(method="sample", temperature=1.0, top_k=0, top_p=1.0,
                                max_new_tokens=6, cache_length=40)
    runs = {}
    for grow_from in (None, 8):
        sampler = conversations.Sampler(graphdef, model.config, spec, grow_from=grow_from)
        conv = sampler.new_conversations(2, seed=5)
        rng, turns, capacities = np.random.default_rng(6), [], []
        for lengths in ((6, 4), (4, 1), (4, 1)):
            turns.append(conv.step(params, random_prompts(rng, lengths)))
            capacities.append(conv.state.cache.max_len)
        runs[grow_from] = turns, capacities
    assert runs[None][1] == [40, 40, 40]
    assert runs[8][1] == [16, 32, 32]  # row 0 needs 11, then 21, then 31 slots
    for whole, grown in zip(runs[None][0], runs[8][0]):
        for b in range(2):
            np.testing.assert_array_equal(grown.tokens[b], whole.tokens[b])
            np.testing.assert_allclose(grown.logprobs[b], whole.logprobs[b], rtol=0, atol=1e-5)


def test_cache_growth_settings_are_checked(make_pair):
    _, model = make_pair("qwen2")
    graphdef, _ = nnx.split(model)
    spec = sampling.SamplerSpec(max_new_tokens=6, cache_length=40)
    with pytest.raises(ValueError, match="grow_from must be a positive slot count"):
        conversations.Sampler(graphdef, model.config, spec, grow_from=0)
    sampler = conversations.Sampler(graphdef, model.config, spec, grow_from=8)
    assert [sampler.capacity_for(n) for n in (0, 8, 9, 33, 40)] == [8, 8, 16, 40, 40]
    assert conversations.Sampler(graphdef, model.config, spec, grow_from=None).capacity_for(1) == 40
    state = engine.init_state(model.config, 2, spec, capacity=16)
    with pytest.raises(ValueError, match="a cache cannot shrink: 16 slots -> 8"):
        engine.grow_state(state, 8)
