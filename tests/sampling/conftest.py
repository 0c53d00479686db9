"""Fixtures for the sampler tests: tiny random transformers checkpoints and their crl_jax twins."""

import numpy as np
import pytest

VOCAB = 97

def _architectures(transformers):
    return {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
                  dict(tie_word_embeddings=False)),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
                  dict(tie_word_embeddings=True)),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
                  dict(tie_word_embeddings=False)),
    }


@pytest.fixture(scope="session")
def make_pair(tmp_path_factory):
    """make_pair(arch) -> (torch model, crl_jax model), identical weights, cached per arch."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from crl_jax import models

    made = {}

    def make(arch):
        if arch not in made:
            config_cls, model_cls, extra = _architectures(transformers)[arch]
            torch.manual_seed(len(made))
            # A wide init makes logits peaked, so greedy paths are varied (not one repeated token)
            # and argmax margins are far above float32 noise.
            config = config_cls(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                head_dim=16, max_position_embeddings=512, initializer_range=0.15,
                                **extra)
            torch_model = model_cls(config).eval()
            with torch.no_grad():
                for name, p in torch_model.named_parameters():
                    if "norm" in name or name.endswith("bias"):
                        p.add_(0.1 * torch.randn_like(p))
            path = tmp_path_factory.mktemp(arch)
            torch_model.save_pretrained(path)
            made[arch] = (torch_model, models.from_pretrained(str(path)))
        return made[arch]

    return make


def random_prompts(rng: np.random.Generator, lengths, vocab: int = VOCAB):
    return [list(map(int, rng.integers(0, vocab, n))) for n in lengths]


@pytest.fixture(autouse=True)
def _single_torch_thread():
    """The transformers reference runs on one thread in these tests: tiny models gain nothing
    from more, and OpenMP spinning makes torch very slow when the CPU is shared."""
    try:
        import torch
    except ImportError:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
