"""Sampling methods and stop matching on hand-made inputs, against numpy references."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from crl_jax.sampling import SamplerSpec, choose_tokens, stops


@functools.partial(jax.jit, static_argnums=(0, 3))
def draw_many(spec, logits, seed, count):
    """count independent draws (tokens only) from the same logits [B,V] -> [count, B]."""
    keys = jax.random.split(jax.random.key(seed), count)
    return jax.vmap(lambda k: choose_tokens(k, logits, spec)[0])(keys)


def allowed_set(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> set[int]:
    """numpy reference of the transformers warpers: temperature, top-k, then top-p."""
    scaled = logits.astype(np.float64) / temperature
    order = np.argsort(-scaled, kind="stable")
    if top_k:
        order = order[:top_k]
    probs = np.exp(scaled[order] - scaled[order].max())
    probs /= probs.sum()
    keep = np.cumsum(probs) - probs < top_p
    return set(order[keep].tolist())


@pytest.mark.parametrize("top_k,top_p", [(3, 1.0), (0, 0.6), (5, 0.8), (100, 0.99)])
def test_top_k_top_p_never_leave_the_allowed_set(top_k, top_p):
    rng = np.random.default_rng(top_k)
    logits = rng.normal(size=(64, 200)).astype(np.float32) * 3
    spec = SamplerSpec(method="sample", temperature=0.9, top_k=top_k, top_p=top_p)
    draw = jax.jit(lambda key, x: choose_tokens(key, x, spec))
    allowed = [allowed_set(row, 0.9, top_k, top_p) for row in logits]
    seen = [set() for _ in logits]
    for i in range(20):
        tokens, logprob, processed = jax.device_get(draw(jax.random.key(i), logits))
        for b, t in enumerate(tokens):
            assert int(t) in allowed[b], (b, int(t), sorted(allowed[b]))
            seen[b].add(int(t))
        # Raw logprob is the model's log-softmax at temperature 1; processed is renormalised.
        raw = jax.nn.log_softmax(logits, axis=-1)
        np.testing.assert_allclose(logprob, np.asarray(raw)[np.arange(64), tokens], atol=1e-5)
        for b, t in enumerate(tokens):
            kept = sorted(allowed[b])
            scaled = logits[b, kept].astype(np.float64) / 0.9
            want = scaled[kept.index(int(t))] - np.log(np.sum(np.exp(scaled)))
            np.testing.assert_allclose(processed[b], want, atol=1e-4)
    # The sampler really samples: rows with several allowed tokens show more than one of them.
    wide = [b for b in range(64) if len(allowed[b]) >= 3]
    assert wide and np.mean([len(seen[b]) > 1 for b in wide]) > 0.8


def test_top_p_keeps_the_smallest_prefix_and_at_least_one_token():
    # probs 0.5, 0.3, 0.2: top_p 0.5 keeps only the first; 0.75 keeps two; tiny top_p keeps one.
    logits = np.log(np.array([[0.5, 0.3, 0.2]], np.float32))
    for top_p, want in [(0.5, {0}), (0.75, {0, 1}), (1e-6, {0}), (0.81, {0, 1, 2})]:
        spec = SamplerSpec(method="sample", top_p=top_p)
        got = set(np.asarray(draw_many(spec, jnp.asarray(logits), 0, 60)).ravel().tolist())
        assert got == want, (top_p, got)
        assert allowed_set(logits[0], 1.0, 0, top_p) == want


def test_greedy_is_argmax_and_temperature_sampling_follows_the_distribution():
    logits = jnp.asarray([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]])
    tokens, logprob, processed = jax.jit(choose_tokens, static_argnums=2)(
        jax.random.key(0), logits, SamplerSpec())
    np.testing.assert_array_equal(tokens, [1, 0])
    np.testing.assert_array_equal(processed, 0.0)
    spec = SamplerSpec(method="sample", temperature=2.0)
    draws = np.asarray(draw_many(spec, logits[:1], 1, 20000))[:, 0]
    freq = np.bincount(draws, minlength=3) / 20000
    np.testing.assert_allclose(freq, jax.nn.softmax(logits[0] / 2.0), atol=0.015)


def test_seeded_sampling_is_reproducible():
    logits = jnp.asarray(np.random.default_rng(0).normal(size=(8, 50)), jnp.float32)
    spec = SamplerSpec(method="sample", temperature=0.99, top_k=100, top_p=0.99)
    a, b, c = (draw_many(spec, logits, seed, 3) for seed in (7, 7, 8))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_stop_window_matches_sequences_and_eos_exactly():
    spec = SamplerSpec(eos_ids=(9,), stop_sequences=((4, 5, 6), (7,)))
    stream = [[1, 4, 5, 6, 2], [4, 5, 4, 5, 6], [5, 6, 1, 2, 3], [7, 0, 0, 0, 0], [1, 9, 7, 0, 0]]
    window = stops.empty_window(len(stream), spec)
    first_stop = [None] * len(stream)
    for step in range(5):
        tokens = jnp.asarray([row[step] for row in stream], jnp.int32)
        window, matched = stops.push_and_match(window, tokens, spec)
        eos = stops.is_eos(tokens, spec)
        for b in range(len(stream)):
            if (matched[b] or eos[b]) and first_stop[b] is None:
                first_stop[b] = step + 1
    assert first_stop == [4, 5, None, 1, 2]
    assert [stops.match_stop_sequences_np(row, spec) for row in stream] == first_stop


def test_spec_validation_names_every_problem():
    with pytest.raises(ValueError) as err:
        SamplerSpec(method="beam", temperature=0.0, top_p=1.5, max_new_tokens=0, overflow="wrap",
                    stop_sequences=((),))
    message = str(err.value)
    for word in ("method", "temperature", "top_p", "max_new_tokens", "overflow", "empty"):
        assert word in message
    with pytest.raises(ValueError, match="smaller than cache_length"):
        SamplerSpec(max_new_tokens=64, cache_length=64)
    spec = SamplerSpec(eos_ids=[2, 3], stop_sequences=[[1, 2]])
    assert hash(spec) == hash(SamplerSpec(eos_ids=(2, 3), stop_sequences=((1, 2),)))
