"""Actor update throughput: crl_jax's jitted train_step against a PyTorch eager implementation.

Both sides train the same decoder (same random weights, exported through crl_jax's HF writer and
loaded by `transformers`), on the same batch, with the same loss (token-level PPO-clip on the
actor's tokens, seq-mean-token-mean, old log-probs recomputed = detached current ones) and the same
optimiser (global-norm clipping at 1.0 then AdamW), in float32. Steps alternate between the two so
that background load hits both alike; the median step time is reported.

The matmul peak is measured in the same run: a large float32 jnp matmul, timed the same way.
crl_jax's achieved FLOP/s uses the analytic training cost (6 x matmul params x tokens plus
attention), divided by that peak.

Prints one JSON line. Example:
  python benchmarks/train_step.py --preset=tiny --batch=8 --seq=256 --steps=6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from crl_jax.run import host_memory  # noqa: E402

# Both sides on the allocator `experiments/run.py` runs on: tcmalloc where installed.
host_memory.reexec_with_caching_malloc()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from crl_jax import models, sharding  # noqa: E402
from crl_jax.rl import batch as batch_lib  # noqa: E402
from crl_jax.rl import state as state_lib  # noqa: E402
from crl_jax.rl import train_step as ts  # noqa: E402

LR, EPS_CLIP = 1e-5, 0.2


def training_flops(cfg, batch: int, seq: int) -> float:
    """6 x (matmul weights) x tokens, plus attention scores and values (4 B T^2 N H per layer
    forward, x3 for forward + backward)."""
    d, f, n, k, h = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                     cfg.head_dim)
    per_layer = d * n * h * 2 + d * k * h * 2 + 3 * d * f
    matmul_params = cfg.num_layers * per_layer + d * cfg.vocab_size
    attention = cfg.num_layers * 4 * batch * seq * seq * n * h
    return 6.0 * matmul_params * batch * seq + 3.0 * attention


def matmul_peak_flops(n: int = 2048, reps: int = 5) -> float:
    a = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), jnp.float32)
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f(a, a).block_until_ready()
        times.append(time.perf_counter() - t)
    return 2.0 * n**3 / min(times)


def make_batch(cfg, b: int, t: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab_size, (b, t))
    loss_mask = np.zeros((b, t), np.float32)
    loss_mask[:, t // 4:] = 1.0  # first quarter is prompt
    return batch_lib.make_policy_batch(tokens, loss_mask, rng.integers(0, 2, b).astype(np.float32),
                                       group_ids=np.arange(b) // 4, guided=(np.arange(b) % 4) >= 2)


def torch_setup(model_dir, batch, advantages):
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    tokens = torch.as_tensor(np.asarray(batch.tokens), dtype=torch.long)
    attn = torch.as_tensor(np.asarray(batch.attention_mask), dtype=torch.long)
    mask = torch.as_tensor(np.asarray(batch.loss_mask))[:, 1:]
    adv = torch.as_tensor(np.asarray(advantages))[:, None]

    def step():
        logits = model(input_ids=tokens, attention_mask=attn).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, 1:, None])[..., 0]
        ratio = torch.exp(logp - logp.detach())
        obj = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - EPS_CLIP, 1 + EPS_CLIP) * adv)
        per_seq = (-obj * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        loss = per_seq.sum() / (mask.sum(-1) > 0).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(loss.detach())

    return step, model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()

    import torch
    torch.set_num_threads(args.threads)

    cfg = models.get_preset(args.preset, dtype="float32", param_dtype="float32")
    model = models.Decoder(cfg, rngs=nnx.Rngs(0))
    batch = make_batch(cfg, args.batch, args.seq)
    train_cfg = ts.TrainConfig()  # PPO-clip 0.2, seq_mean_token_mean, recomputed old log-probs
    advantages = np.array(ts.adv_lib.group_advantages(
        batch.rewards, batch.group_ids, batch.guided))

    with tempfile.TemporaryDirectory() as tmp:
        models.save_pretrained(model, tmp)
        torch_step, torch_model = torch_setup(tmp, batch, advantages)

    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    graphdef, params = nnx.split(model)
    tx = state_lib.make_optimizer(state_lib.OptimizerConfig(learning_rate=LR))
    state = state_lib.TrainState.create(graphdef, params, tx)
    # On the mesh, as a run places it: a state left on one device would make the first timed
    # step compile again for the mesh-sharded state the compiled step returns.
    state = jax.device_put(state, state_lib.state_shardings(mesh, state))
    train_batch = batch_lib.TrainBatch(jax.device_put(batch), None)
    step_fn = ts.make_train_step(train_cfg, mesh, state, None, train_batch)

    t = time.perf_counter()
    state, _, metrics = step_fn(state, None, train_batch)
    jax.block_until_ready(state.params)
    compile_s = time.perf_counter() - t
    torch_step()  # warm-up (allocator, thread pools)
    # Same update on both sides: after one step the weights agree to a small fraction of the lr
    # (Adam's first step moves every weight by about lr, so this checks the whole gradient's sign).
    embed_jax = np.asarray(state.params["embed"].value)
    embed_torch = torch_model.get_input_embeddings().weight.detach().numpy()
    step1_diff = float(np.abs(embed_jax - embed_torch).max())

    jax_times, torch_times = [], []
    for _ in range(args.steps):
        t = time.perf_counter()
        state, _, metrics = step_fn(state, None, train_batch)
        jax.block_until_ready(state.params)
        jax_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        torch_step()
        torch_times.append(time.perf_counter() - t)

    peak = matmul_peak_flops()
    tokens = args.batch * args.seq
    jax_tps = tokens / statistics.median(jax_times)
    torch_tps = tokens / statistics.median(torch_times)
    achieved = training_flops(cfg, args.batch, args.seq) / statistics.median(jax_times)
    print(json.dumps({
        "benchmark": "actor_train_step", "backend": jax.default_backend(), "preset": args.preset,
        "params": cfg.num_params(), "batch": args.batch, "seq": args.seq, "steps": args.steps,
        "threads": args.threads, "dtype": "float32",
        "crl_jax_tokens_per_s": round(jax_tps, 1), "torch_tokens_per_s": round(torch_tps, 1),
        "speedup_vs_torch": round(jax_tps / torch_tps, 3),
        "crl_jax_step_s_median": round(statistics.median(jax_times), 4),
        "torch_step_s_median": round(statistics.median(torch_times), 4),
        "crl_jax_compile_s": round(compile_s, 2),
        "matmul_peak_gflops": round(peak / 1e9, 1),
        "crl_jax_achieved_gflops": round(achieved / 1e9, 1),
        "crl_jax_fraction_of_matmul_peak": round(achieved / peak, 3),
        "embed_max_abs_diff_after_step1_in_lr_units": round(step1_diff / LR, 4),
        "malloc": host_memory.malloc_in_use(),
    }))


if __name__ == "__main__":
    main()
