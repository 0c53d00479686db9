"""Sampling methods: turn one step of logits into tokens and their log-probabilities.

Pure jnp, used inside the decode loop. Greedy takes the argmax of the raw logits; "sample" applies
temperature, then top-k, then top-p (the order `transformers` uses) and draws from what is left.

Two log-probabilities come back for every chosen token:
- `logprob`: log-softmax of the model's *raw* logits (temperature 1, nothing filtered). This is
  the quantity the PPO/GRPO ratio pi_theta / pi_theta_old needs, since the trainer recomputes
  pi_theta with a plain forward pass.
- `processed_logprob`: log-probability under the distribution the token was actually drawn from
  (0.0 for greedy). Useful for importance corrections; not for the policy ratio.

Legend: B batch, V vocab, C candidate tokens kept after top-k / sorting.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from crl_jax.sampling.spec import SamplerSpec


def _top_p_mask(sorted_logits: jax.Array, top_p: float) -> jax.Array:
    """[B,C] keep-mask for logits sorted in descending order: the smallest prefix whose
    probability reaches top_p. The first token is always kept because its exclusive cumulative
    probability is 0."""
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    exclusive_cum = jnp.cumsum(probs, axis=-1) - probs
    return exclusive_cum < top_p


def candidate_logits(logits: jax.Array, spec: SamplerSpec) -> tuple[jax.Array, jax.Array | None]:
    """Processed logits the "sample" method draws from.

    Returns (scores [B,C], ids [B,C] or None). With top-k or top-p the candidates are sorted in
    descending order and `ids` maps a candidate back to its vocabulary id; filtered-out
    candidates have score -inf. With neither, scores are the whole temperature-scaled vocabulary
    and ids is None (no sort needed).
    """
    scaled = logits.astype(jnp.float32) / jnp.float32(spec.temperature)
    vocab = scaled.shape[-1]
    if spec.top_k == 0 and spec.top_p >= 1.0:
        return scaled, None
    # top_k is a partial sort (cheap for k=100); top-p alone needs the full descending order.
    k = min(spec.top_k, vocab) if spec.top_k > 0 else vocab
    scores, ids = jax.lax.top_k(scaled, k)
    if spec.top_p < 1.0:
        scores = jnp.where(_top_p_mask(scores, spec.top_p), scores, -jnp.inf)
    return scores, ids


def _first_argmax(logits: jax.Array) -> jax.Array:
    """jnp.argmax over the last axis (the first index of the maximum) as two single-output
    reductions: XLA's CPU backend runs argmax's paired (value, index) reduction without
    vectorising it, and for a decode step's [B, V] logits that took longer than the LM head."""
    vocab = logits.shape[-1]
    best = jnp.max(logits, axis=-1, keepdims=True)
    first = jnp.min(jnp.where(logits == best, jnp.arange(vocab, dtype=jnp.int32), vocab), axis=-1)
    return jnp.minimum(first, vocab - 1)  # NaN logits match nothing: take the last id, not V


def choose_tokens(rng: jax.Array, logits: jax.Array, spec: SamplerSpec
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Pick one token per row from logits [B,V].

    Returns (tokens [B] int32, logprob [B] float32 raw-model, processed_logprob [B] float32).
    """
    logits = logits.astype(jnp.float32)
    raw_logprobs = jax.nn.log_softmax(logits, axis=-1)
    if spec.method == "greedy":
        tokens = _first_argmax(logits)
        processed = jnp.zeros(tokens.shape, jnp.float32)
    else:
        scores, ids = candidate_logits(logits, spec)
        choice = jax.random.categorical(rng, scores, axis=-1)
        processed = jnp.take_along_axis(jax.nn.log_softmax(scores, axis=-1), choice[:, None],
                                        axis=-1)[:, 0]
        tokens = choice if ids is None else jnp.take_along_axis(ids, choice[:, None], axis=-1)[:, 0]
        tokens = tokens.astype(jnp.int32)
    logprob = jnp.take_along_axis(raw_logprobs, tokens[:, None], axis=-1)[:, 0]
    return tokens, logprob, processed
