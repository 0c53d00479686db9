"""Compile time against depth: layers are scanned, so a 28-layer 7B model should compile in about
the time of a 2-layer one. Compiles forward+backward from abstract parameters (nothing allocated).

    python benchmarks/compile_time.py [--preset qwen2.5-7b] [--seq 128]

Prints one JSON line: compile seconds for the full depth and for 2 layers, and their ratio.
"""

import argparse
import json
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from crl_jax import models  # noqa: E402


def compile_seconds(cfg, seq: int) -> float:
    graphdef, abstract_params = nnx.split(nnx.eval_shape(lambda: models.Decoder(cfg, rngs=nnx.Rngs(0))))
    tokens = jax.ShapeDtypeStruct((1, seq), jnp.int32)

    def loss(params, tokens):
        return models.apply(graphdef, params, tokens).mean()

    start = time.perf_counter()
    jax.jit(jax.value_and_grad(loss)).lower(abstract_params, tokens).compile()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="qwen2.5-7b")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--remat", default="full")
    args = parser.parse_args()
    cfg = models.get_preset(args.preset, dtype="bfloat16", param_dtype="bfloat16", remat=args.remat)
    shallow = compile_seconds(cfg.replace(num_layers=2), args.seq)
    deep = compile_seconds(cfg, args.seq)
    print(json.dumps({"benchmark": "compile_time", "preset": args.preset, "layers": cfg.num_layers,
                      "compile_s_full_depth": round(deep, 2), "compile_s_2_layers": round(shallow, 2),
                      "ratio": round(deep / shallow, 3)}))


if __name__ == "__main__":
    main()
