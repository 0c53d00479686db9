"""Greedy generation speed: crl_jax's sampler against transformers (PyTorch, CPU), same weights.

For each config, random weights are made once in transformers, saved, and loaded into crl_jax; a
batch of random prompts is generated greedily by both, side by side in one process, and the
tokens are compared. The two sides alternate, `--repeats` runs each, and the medians are
compared. Prints one JSON line per config: both tokens/s (new tokens only, prefill included in
the time), their ratio, whether the tokens agree, and crl_jax's achieved GFLOP/s as a
fraction of a float32 matmul peak measured in the same run.

    python benchmarks/sampler.py                     # qwen2-7m and smollm2-135m, B=32, 128+128
    python benchmarks/sampler.py --configs=qwen2-7m --batch=8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from crl_jax.run import host_memory  # noqa: E402

# Both sides on the allocator `experiments/run.py` runs on: tcmalloc where installed.
host_memory.reexec_with_caching_malloc()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from flax import nnx  # noqa: E402

from crl_jax import models, sampling  # noqa: E402
from crl_jax.rollout import conversations  # noqa: E402

CONFIGS = {
    # ~7M parameters, Qwen2 layout (q/k/v biases, tied embeddings, GQA).
    "qwen2-7m": models.DecoderConfig(
        vocab_size=8192, hidden_size=256, intermediate_size=1024, num_layers=5, num_heads=4,
        num_kv_heads=2, head_dim=64, rope_theta=1000000.0, tie_embeddings=True, qkv_bias=True,
        model_type="qwen2", max_position_embeddings=4096),
    "smollm2-135m": models.get_preset("smollm2-135m"),
}


def matmul_peak_gflops(size: int = 1024, repeats: int = 5) -> float:
    """Best float32 matmul throughput of this process's XLA CPU backend."""
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (size, size), jnp.float32)
    mm = jax.jit(lambda x, y: x @ y)
    mm(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        mm(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * size ** 3 / best / 1e9


def generation_flops(cfg: models.DecoderConfig, batch: int, prompt: int, new: int) -> float:
    """Useful FLOPs: 2 per weight per token (lm head only where logits are used) + attention
    over the real context (QK^T and PV, 4 * context * N * H per layer per token)."""
    embed = cfg.vocab_size * cfg.hidden_size
    body = cfg.num_params() - embed * (1 if cfg.tie_embeddings else 2)
    head = embed
    attn_per_ctx = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim
    prefill = batch * (prompt * 2 * body + 2 * head + attn_per_ctx * prompt * (prompt + 1) / 2)
    decode = 0.0
    for i in range(1, new):
        decode += batch * (2 * body + 2 * head + attn_per_ctx * (prompt + i))
    return prefill + decode


def make_pair(cfg: models.DecoderConfig, folder: str, seed: int = 0):
    torch.manual_seed(seed)
    hf_config = models.config_to_hf(cfg)
    torch_model = transformers.AutoModelForCausalLM.from_config(hf_config).float().eval()
    torch_model.save_pretrained(folder)
    return torch_model, models.from_pretrained(folder)


def transformers_runner(torch_model, prompts: np.ndarray, new: int):
    """A callable that generates greedily with transformers: (new tokens [B, new], seconds)."""
    config = transformers.GenerationConfig(do_sample=False, max_new_tokens=new, min_new_tokens=new,
                                           eos_token_id=None, pad_token_id=0)
    ids = torch.tensor(prompts, dtype=torch.long)
    with torch.inference_mode():
        warmup = transformers.GenerationConfig(do_sample=False, max_new_tokens=4, min_new_tokens=4,
                                               eos_token_id=None, pad_token_id=0)
        torch_model.generate(input_ids=ids[:2, :8], attention_mask=torch.ones_like(ids[:2, :8]),
                             generation_config=warmup)

    def run():
        with torch.inference_mode():
            start = time.perf_counter()
            out = torch_model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                       generation_config=config)
            return out[:, prompts.shape[1]:].numpy(), time.perf_counter() - start
    return run


def crl_jax_runner(model, prompts: np.ndarray, new: int):
    """A callable that generates greedily with crl_jax's sampler (compiled here)."""
    graphdef, params = nnx.split(model)
    spec = sampling.SamplerSpec(method="greedy", max_new_tokens=new,
                                cache_length=prompts.shape[1] + new)
    sampler = conversations.Sampler(graphdef, model.config, spec)
    rows = [list(map(int, p)) for p in prompts]
    sampler.generate(params, rows)  # compile

    def run():
        start = time.perf_counter()
        result = sampler.generate(params, rows)
        return np.stack(result.tokens), time.perf_counter() - start
    return run


def alternate(runners: dict, repeats: int) -> tuple[dict, dict]:
    """Run each callable `repeats` times, alternating, so background load hits all alike:
    ({name: median seconds}, {name: last output})."""
    times, outputs = {name: [] for name in runners}, {}
    for _ in range(repeats):
        for name, run in runners.items():
            outputs[name], seconds = run()
            times[name].append(seconds)
    return {name: statistics.median(t) for name, t in times.items()}, outputs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="qwen2-7m,smollm2-135m")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5, help="alternated runs per side (median)")
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="torch intra-op threads (0: torch's default, one per core)")
    args = parser.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    peak = matmul_peak_gflops()
    for name in args.configs.split(","):
        cfg = CONFIGS[name]
        with tempfile.TemporaryDirectory() as folder:
            torch_model, model = make_pair(cfg, folder)
        prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.prompt))
        medians, outputs = alternate({"crl_jax": crl_jax_runner(model, prompts, args.new),
                                      "transformers": transformers_runner(torch_model, prompts, args.new)},
                                     args.repeats)
        (our_s, their_s), (ours, theirs) = medians.values(), outputs.values()
        tokens = args.batch * args.new
        gflops = generation_flops(cfg, args.batch, args.prompt, args.new) / our_s / 1e9
        print(json.dumps({
            "config": name, "params_m": round(cfg.num_params() / 1e6, 2), "batch": args.batch,
            "prompt": args.prompt, "new_tokens": args.new, "repeats": args.repeats,
            "crl_jax_tokens_per_s": round(tokens / our_s, 1),
            "transformers_tokens_per_s": round(tokens / their_s, 1),
            "ratio": round(their_s / our_s, 3),
            "tokens_equal_fraction": float(np.mean(ours == theirs)),
            "crl_jax_gflops": round(gflops, 2), "matmul_peak_gflops": round(peak, 2),
            "fraction_of_peak": round(gflops / peak, 3),
            "devices": str(jax.devices()[0].platform), "torch_threads": torch.get_num_threads(),
            "jax_threads": os.cpu_count(), "malloc": host_memory.malloc_in_use(),
        }), flush=True)


if __name__ == "__main__":
    main()
