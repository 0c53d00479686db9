"""Greedy generation and log-probabilities against transformers (PyTorch, float32)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

from crl_jax import models, sampling  # noqa: E402
from crl_jax.sharding import logical_to_spec, make_mesh  # noqa: E402
from crl_jax.sampling import engine  # noqa: E402
from crl_jax.rollout import conversations  # noqa: E402
from tests.sampling.conftest import random_prompts  # noqa: E402

NEW = 10
LENGTHS = (11, 6, 3, 1)
SPEC = sampling.SamplerSpec(method="greedy", max_new_tokens=NEW, cache_length=64)


def hf_greedy(torch_model, prompts, new=NEW):
    """transformers generate(do_sample=False) on a left-padded batch; no EOS, exactly `new` tokens."""
    width = max(map(len, prompts))
    ids = np.zeros((len(prompts), width), np.int64)
    mask = np.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, width - len(p):] = p
        mask[b, width - len(p):] = 1
    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=new, min_new_tokens=new,
                                           eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        out = torch_model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                                   generation_config=config)
    return out[:, width:].numpy()


def hf_logprobs(torch_model, sequence):
    """[T, V] log-softmax of a full forward over one unpadded sequence."""
    with torch.no_grad():
        logits = torch_model(input_ids=torch.tensor([sequence])).logits[0]
    return torch.log_softmax(logits.double(), dim=-1).numpy()


def run_engine(model, prompts, padding, spec=SPEC):
    """Call the device-side generate directly on a left- or right-padded chunk."""
    graphdef, params = nnx.split(model)
    width = 16
    tokens = np.zeros((len(prompts), width), np.int32)
    mask = np.zeros(tokens.shape, bool)
    for b, p in enumerate(prompts):
        sl = slice(width - len(p), width) if padding == "left" else slice(0, len(p))
        tokens[b, sl], mask[b, sl] = p, True
    state = engine.init_state(model.config, len(prompts), spec, seed=0)
    ones = jnp.ones(len(prompts), bool)
    state, out = engine.jitted_generate(graphdef, spec)(params, state, tokens, mask, ones, ~ones)
    return jax.device_get(out), jax.device_get(state.cache.end)


def with_attention(model, implementation: str, block: int = 8):
    """A copy of `model` whose attention (prefill included) uses `implementation`."""
    graphdef, params = nnx.split(model)
    copy = nnx.merge(graphdef, params)
    copy.config = copy.config.replace(attention=implementation, attention_block=block)
    return copy


@pytest.mark.parametrize("attention", ["materialized", "blockwise"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_matches_transformers_left_and_right_padding(make_pair, arch, attention):
    torch_model, model = make_pair(arch)
    model = with_attention(model, attention)
    prompts = random_prompts(np.random.default_rng(1), LENGTHS)
    expected = hf_greedy(torch_model, prompts)
    assert len({tuple(r) for r in expected}) > 1 and len(set(expected[0])) > 2  # non-degenerate
    for padding in ("left", "right"):
        out, end = run_engine(model, prompts, padding)
        np.testing.assert_array_equal(out.tokens, expected, err_msg=f"{arch} {padding}-padded")
        np.testing.assert_array_equal(out.lengths, NEW)
        assert all(sampling.FINISH_REASONS[int(r)] == "max_new_tokens" for r in out.finish_reason)
        # Every token but the last one is in the cache; left padding also spends pad slots.
        real = np.array(LENGTHS) + NEW - 1
        np.testing.assert_array_equal(end, real if padding == "right" else 16 + NEW - 1)
        # Returned log-probs are the raw model's, from a full forward over the final sequence.
        for b, p in enumerate(prompts):
            full = hf_logprobs(torch_model, p + list(expected[b]))
            want = full[np.arange(len(p) - 1, len(p) + NEW - 1), expected[b]]
            np.testing.assert_allclose(out.logprobs[b], want, atol=1e-4)


def test_session_generate_and_multi_turn_equals_single_run(make_pair):
    """Three turns of appended environment text continue the cache exactly: the last response
    equals a fresh run over the whole history, and every logprob matches one full forward. The
    cache starts at 8 slots and grows as the turns need (up to the spec's 64)."""
    torch_model, model = make_pair("qwen2")
    graphdef, params = nnx.split(model)
    sampler = conversations.Sampler(graphdef, model.config, SPEC.replace(max_new_tokens=6), grow_from=8)
    rng = np.random.default_rng(2)
    prompts = random_prompts(rng, (7, 3, 5))
    conv = sampler.new_conversations(3)
    turn = conv.step(params, prompts)
    np.testing.assert_array_equal(np.stack(turn.tokens), hf_greedy(torch_model, prompts, 6))
    responses = [[list(t)] for t in turn.tokens]
    logprobs = [[lp] for lp in turn.logprobs]
    capacities = [conv.state.cache.max_len]
    for _ in range(3):
        env = random_prompts(rng, rng.integers(1, 6, 3))
        prefix = [conv.history(b) + env[b] for b in range(3)]
        cached_before = [conv.cached_length(b) for b in range(3)]
        turn = conv.step(params, env)
        for b in range(3):
            responses[b].append(list(turn.tokens[b]))
            logprobs[b].append(turn.logprobs[b])
            # Only the new tokens (+ the pending one) were written: the prefix was not recomputed.
            assert conv.cached_length(b) == cached_before[b] + 1 + len(env[b]) + 6 - 1
        capacities.append(conv.state.cache.max_len)
    assert capacities[0] == 16 and capacities[-1] > capacities[0] and max(capacities) <= 64
    single = sampler.generate(params, prefix)
    for b in range(3):
        np.testing.assert_array_equal(single.tokens[b], responses[b][-1])
        np.testing.assert_allclose(single.logprobs[b], logprobs[b][-1], atol=1e-4)
        history = conv.history(b)
        full = hf_logprobs(torch_model, history)
        position = 0
        for response, lp in zip(responses[b], logprobs[b]):
            # Locate each response in the history, then compare its logprobs.
            while history[position:position + len(response)] != response:
                position += 1
            want = full[np.arange(position - 1, position + len(response) - 1), response]
            np.testing.assert_allclose(lp, want, atol=1e-4)
            position += len(response)


def test_sharded_generation_equals_single_device(make_pair):
    torch_model, model = make_pair("qwen3")
    mesh = make_mesh((2, 2, 2))
    graphdef, params = nnx.split(model)
    sharded = conversations.shard_params(params, mesh)
    assert jax.tree.leaves(sharded)[-1].sharding.mesh.shape == mesh.shape
    prompts = random_prompts(np.random.default_rng(3), (9, 2, 5, 4))
    # The cache grows from 8 slots to 32 (prompts of up to 9 tokens + 10 new), staying sharded.
    sampler = conversations.Sampler(graphdef, model.config, SPEC, mesh=mesh, grow_from=8)
    conv = sampler.new_conversations(4)
    out = conv.step(params=sharded, new_tokens=prompts)
    k = conv.state.cache.k
    # Batch over (data, fsdp) and kv heads over tensor, wherever the cache layout puts them.
    expected = NamedSharding(mesh, logical_to_spec(models.CACHE_LOGICAL_AXES.k, mesh, k.shape))
    assert k.sharding.is_equivalent_to(expected, k.ndim)
    assert ("data", "fsdp") in tuple(k.sharding.spec) and "tensor" in tuple(k.sharding.spec)
    np.testing.assert_array_equal(np.stack(out.tokens), hf_greedy(torch_model, prompts))
