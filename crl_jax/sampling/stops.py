"""Stop conditions checked inside the decode loop: EOS ids and stop sequences of token ids.

Each row keeps a window of its last `Lmax` generated tokens (Lmax = longest stop sequence). Stop
sequences are stored right-aligned in a [J, Lmax] table whose left padding is a wildcard, so one
broadcast comparison checks every sequence against every row. The window starts empty at each
call: a stop sequence matches only on tokens generated in that call, never on the prompt or on
tokens the environment appended.

Legend: B batch, J stop sequences, L window length (longest stop sequence).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from crl_jax.sampling.spec import SamplerSpec

# Finish reasons reported per row.
RUNNING, EOS, STOP_SEQUENCE, MAX_TOKENS, CACHE_FULL, INACTIVE = 0, 1, 2, 3, 4, 5
FINISH_REASONS = {RUNNING: "running", EOS: "eos", STOP_SEQUENCE: "stop_sequence",
                  MAX_TOKENS: "max_new_tokens", CACHE_FULL: "cache_full", INACTIVE: "inactive"}

_WILDCARD = -1  # never a token id, so it also marks "no token yet" in the window
_EMPTY = -2


def stop_table(spec: SamplerSpec) -> np.ndarray:
    """[J, L] int32: each stop sequence right-aligned, left-padded with the wildcard."""
    length = max(spec.max_stop_length, 1)
    table = np.full((max(len(spec.stop_sequences), 1), length), _WILDCARD, np.int32)
    if not spec.stop_sequences:
        table[:] = _EMPTY  # matches nothing: the window never holds -2
    for j, seq in enumerate(spec.stop_sequences):
        table[j, length - len(seq):] = seq
    return table


def empty_window(batch: int, spec: SamplerSpec) -> jax.Array:
    """[B, L] window of recent tokens; -1 means "nothing generated yet"."""
    return jnp.full((batch, max(spec.max_stop_length, 1)), _WILDCARD, jnp.int32)


def push_and_match(window: jax.Array, tokens: jax.Array, spec: SamplerSpec
                   ) -> tuple[jax.Array, jax.Array]:
    """Append tokens [B] to the window; return (window, matched [B] bool)."""
    window = jnp.concatenate([window[:, 1:], tokens[:, None]], axis=1)
    if not spec.stop_sequences:
        return window, jnp.zeros(tokens.shape, bool)
    table = jnp.asarray(stop_table(spec))
    # Wildcard slots match anything; a real slot must match the token there. A sequence that is
    # longer than what was generated so far cannot match: those window slots hold -1 and the
    # table holds real ids there.
    same = (window[:, None, :] == table[None]) | (table[None] == _WILDCARD)
    return window, jnp.any(jnp.all(same, axis=-1), axis=-1)


def is_eos(tokens: jax.Array, spec: SamplerSpec) -> jax.Array:
    """[B] bool: the token is one of the spec's EOS ids."""
    if not spec.eos_ids:
        return jnp.zeros(tokens.shape, bool)
    return jnp.any(tokens[:, None] == jnp.asarray(spec.eos_ids, jnp.int32)[None], axis=-1)


def match_stop_sequences_np(tokens: list[int], spec: SamplerSpec) -> int | None:
    """Host-side reference: index just past the first EOS or completed stop sequence in
    `tokens`, or None. Used to cut text produced elsewhere and by the tests."""
    for i, tok in enumerate(tokens):
        if tok in spec.eos_ids:
            return i + 1
        for seq in spec.stop_sequences:
            if i + 1 >= len(seq) and tuple(tokens[i + 1 - len(seq):i + 1]) == seq:
                return i + 1
    return None
