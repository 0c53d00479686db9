"""Shared pieces of the memory tests: a deterministic text embedder and jitted bank functions."""
import zlib

import numpy as np
import pytest

from crl_jax.memory.search import SearchConfig, jit_bank_fns


def _hash_embed(texts, dim=16):
    """Unit vectors seeded by the text, so equal texts get equal keys (a stand-in key function
    for tests that are about bookkeeping, not semantics)."""
    out = np.stack([np.random.default_rng(zlib.crc32(t.encode())).normal(size=dim) for t in texts]) \
        if texts else np.zeros((0, dim))
    return (out / np.linalg.norm(out, axis=1, keepdims=True).clip(1e-9)).astype(np.float32)


@pytest.fixture(scope="session")
def bank_fns():
    return jit_bank_fns(SearchConfig(k=2), donate=False)


@pytest.fixture(scope="session")
def hash_embed():
    return _hash_embed
