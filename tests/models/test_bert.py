"""BERT encoder: parity with transformers (PyTorch, float32) on a tiny random BERT made here, and
all-MiniLM-L6-v2 embeddings equal to sentence-transformers' on the packaged weights."""
import jax
import numpy as np
import pytest

from crl_jax import sharding
from crl_jax.models import bert

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    torch.manual_seed(0)
    hf_cfg = transformers.BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=40, type_vocab_size=2)
    ref = transformers.BertModel(hf_cfg, add_pooling_layer=False).eval()
    path = tmp_path_factory.mktemp("tiny_bert")
    ref.save_pretrained(path, safe_serialization=True)
    return ref, bert.from_pretrained(str(path))


def _batch(rng, lengths, t, vocab):
    tokens = np.zeros((len(lengths), t), np.int64)
    mask = np.zeros((len(lengths), t), np.int64)
    for i, n in enumerate(lengths):
        tokens[i, :n] = rng.integers(1, vocab, n)
        mask[i, :n] = 1
    return tokens, mask


def test_parity_with_transformers_right_padded(tiny_bert):
    ref, ours = tiny_bert
    tokens, mask = _batch(np.random.default_rng(0), [1, 5, 17, 23], 23, 97)
    with torch.no_grad():
        hidden_ref = ref(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    m = mask.astype(np.float32)[..., None]
    pooled_ref = (hidden_ref * m).sum(1) / m.sum(1)
    run = jax.jit(lambda t, a: (ours.embed(t, a, normalize=False), ours(t, a), ours.embed(t, a)))
    pooled, hidden, unit = map(np.asarray, run(tokens, mask))
    err = np.abs(pooled - pooled_ref).max()
    assert err < 1e-4, err
    assert np.abs((hidden - hidden_ref) * m).max() < 1e-4
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, rtol=1e-6)
    # A different pad length for the same sentences leaves the embeddings unchanged.
    longer = run(np.pad(tokens, ((0, 0), (0, 9))), np.pad(mask, ((0, 0), (0, 9))))[2]
    np.testing.assert_allclose(np.asarray(longer), unit, atol=1e-5)


def test_params_carry_logical_axes(tiny_bert):
    from flax import nnx
    _, ours = tiny_bert
    axes = jax.tree.map(lambda v: v.get_metadata()["logical_axes"], nnx.state(ours, nnx.Param),
                        is_leaf=lambda x: isinstance(x, nnx.Variable))
    assert axes["layers"]["q"] == ("layers", "embed", "heads", "head_dim")
    mesh = sharding.make_mesh((1, 2, 4))
    spec = sharding.logical_to_spec(axes["layers"]["wi"], mesh, ours.layers.wi.value.shape)
    assert spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")


def test_minilm_matches_sentence_transformers():
    st = pytest.importorskip("sentence_transformers")
    tokenizers = pytest.importorskip("tokenizers")
    path = bert.packaged_minilm_path()
    ref = st.SentenceTransformer(path, device="cpu")
    texts = ["goal: reach the staircase, observation: a dark room with a closed door to the east",
             "hi", "The quick brown fox jumps over the lazy dog. " * 3, "ünïcode ✓ tokens"]
    want = ref.encode(texts, convert_to_numpy=True, batch_size=8)
    tok = tokenizers.Tokenizer.from_file(f"{path}/tokenizer.json")
    tok.no_padding()               # the shipped tokenizer.json pads to 128; we pad ourselves
    tok.enable_truncation(256)
    enc = tok.encode_batch(texts)
    t = max(len(e.ids) for e in enc)
    tokens = np.array([e.ids + [0] * (t - len(e.ids)) for e in enc])
    mask = np.array([[1] * len(e.ids) + [0] * (t - len(e.ids)) for e in enc])
    model = bert.from_pretrained(path)
    assert model.config == bert.get_bert_preset("minilm-l6")
    got = np.asarray(jax.jit(model.embed)(tokens, mask))
    err = np.abs(got - want).max()
    assert err < 1e-5, err


def test_missing_folder_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="lacks config.json"):
        bert.from_pretrained(str(tmp_path))
