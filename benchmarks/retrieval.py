"""Experience-bank retrieval: crl_jax's jitted search + diversity re-rank vs FAISS exact search.

For each bank size (20,000 x 384 as with MiniLM keys, 100,000 x 1024 as with Qwen3-Embedding keys),
128 queries retrieve the top 16 candidates by inner product, which are then re-ranked to the top 1
(Eq. 6 score plus the recency demotion). crl_jax runs the whole thing as one jitted call on the
bank pytree; the FAISS side is IndexFlatIP (exact) followed by the same re-rank in numpy. Both run
in this process on the same CPU, their repetitions alternated so that background load hits both
alike; the FAISS search alone is reported too. Prints one JSON line; latencies are medians (with
the best run beside them). Beside each latency: the similarity product's FLOPs (2 x queries x
slots x dims) over it, as a fraction of a float32 matmul peak measured in the same run, the
physical limit both sides share.

    python benchmarks/retrieval.py [--repeats 10] [--sizes 20000x384,100000x1024]
"""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

from crl_jax.run import host_memory  # noqa: E402

# Both sides on the allocator `experiments/run.py` runs on: tcmalloc where installed.
host_memory.reexec_with_caching_malloc()

import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step import matmul_peak_flops  # noqa: E402

from crl_jax.memory import bank as bk  # noqa: E402
from crl_jax.memory.search import SearchConfig, search  # noqa: E402

NUM_QUERIES, TOP_K = 128, 16
CFG = SearchConfig(k=1, candidate_multiplier=TOP_K, count_penalty=0.4, recency_window=1, demote_prob=0.5)


def make_bank(n, dim, rng):
    keys = rng.standard_normal((1, n, dim), dtype=np.float32)
    keys /= np.linalg.norm(keys, axis=-1, keepdims=True)
    last = np.where(rng.random((1, n)) < 0.2, rng.integers(0, 10, (1, n)), -1).astype(np.int32)
    count = np.where(last >= 0, rng.integers(1, 30, (1, n)), 0).astype(np.int32)
    b = bk.init_bank(1, n, dim)
    return b.replace(keys=jax.device_put(keys), valid=np.ones((1, n), bool),
                     entry_id=np.arange(n, dtype=np.int32)[None], retrieval_count=count,
                     last_retrieved_step=last, next_id=np.int32(n))


def numpy_rerank(idx, count, last, step, draws):
    """Same Eq. 6 re-rank + demotion as crl_jax, on FAISS's [B, 16] candidates."""
    c, l = count[idx], last[idx]
    recent = (l >= 0) & (step - l < CFG.recency_window)
    score = -np.arange(idx.shape[1]) - CFG.count_penalty * np.log1p(c) - CFG.recency_penalty * recent
    order = np.argsort(-score, axis=1, kind="stable")
    top = order[:, 0]
    demote = draws & recent[np.arange(len(idx)), top]
    best = np.where(demote, order[:, 1], top)
    return idx[np.arange(len(idx)), best]


def timed_alternately(fns: dict, repeats: int) -> dict:
    """{name: (median, best) seconds}: after one warm-up call each (which also compiles), every
    repetition runs each function once in turn."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: (float(np.median(t)), float(np.min(t))) for name, t in times.items()}


def with_threads(faiss, threads, fn):
    def call():
        faiss.omp_set_num_threads(threads)
        return fn()
    return call


def run(n, dim, repeats, rng, peak):
    import faiss
    b = make_bank(n, dim, rng)
    queries = rng.standard_normal((NUM_QUERIES, dim), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=-1, keepdims=True)
    task_ids = np.zeros(NUM_QUERIES, np.int32)
    key, step = jax.random.key(0), 5
    find = jax.jit(functools.partial(search, cfg=CFG))
    q_dev = jax.device_put(queries)

    index = faiss.IndexFlatIP(dim)
    index.add(np.asarray(b.keys[0]))
    count, last = np.asarray(b.retrieval_count[0]), np.asarray(b.last_retrieved_step[0])
    draws = np.asarray(jax.random.uniform(key, (NUM_QUERIES,)) < CFG.demote_prob)
    faiss_rerank = lambda: numpy_rerank(index.search(queries, TOP_K)[1], count, last, step, draws)
    # FAISS runs with its default OpenMP threads and with one, and the faster of the two is the
    # reference: on a busy machine OpenMP's spinning threads can lose badly.
    default_threads = faiss.omp_get_max_threads()
    fns = {"crl_jax": lambda: find(b, q_dev, task_ids, key, step).entry_ids.block_until_ready()}
    for threads in sorted({default_threads, 1}):
        fns[f"faiss_{threads}"] = with_threads(faiss, threads, faiss_rerank)
        fns[f"faiss_search_{threads}"] = with_threads(
            faiss, threads, lambda: index.search(queries, TOP_K))
    times = timed_alternately(fns, repeats)
    faiss.omp_set_num_threads(default_threads)
    best_threads = min(sorted({default_threads, 1}), key=lambda t: times[f"faiss_{t}"][0])
    jax_s, faiss_s = times["crl_jax"], times[f"faiss_{best_threads}"]

    # Same answers: both sides pick the same entry for every query.
    ours = np.asarray(find(b, q_dev, task_ids, key, step).entry_ids[:, 0])
    same = float(np.mean(ours == faiss_rerank()))
    ms = lambda s: round(s * 1e3, 2)
    product_flops = 2.0 * NUM_QUERIES * n * dim
    return {"bank": f"{n}x{dim}", "queries": NUM_QUERIES, "top_k": TOP_K,
            "crl_jax_ms": ms(jax_s[0]), "faiss_rerank_ms": ms(faiss_s[0]),
            "ratio_crl_jax_over_faiss": round(jax_s[0] / faiss_s[0], 3),
            "crl_jax_best_ms": ms(jax_s[1]), "faiss_rerank_best_ms": ms(faiss_s[1]),
            "faiss_search_only_ms": ms(times[f"faiss_search_{best_threads}"][0]),
            "faiss_threads": best_threads, "repeats": repeats,
            "faiss_rerank_ms_by_threads": {t: ms(times[f"faiss_{t}"][0])
                                           for t in sorted({default_threads, 1})},
            "matmul_peak_gflops": round(peak / 1e9, 1),
            "crl_jax_fraction_of_matmul_peak": round(product_flops / jax_s[0] / peak, 3),
            "faiss_fraction_of_matmul_peak": round(product_flops / faiss_s[0] / peak, 3),
            "same_top1": same}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--sizes", default="20000x384,100000x1024")
    args = parser.parse_args()
    import faiss  # noqa: F401  (fail here, before any bank is built, when the reference is missing)
    rng = np.random.default_rng(0)
    peak = matmul_peak_flops()
    results = [run(*map(int, s.split("x")), args.repeats, rng, peak) for s in args.sizes.split(",")]
    print(json.dumps({"benchmark": "retrieval", "device": jax.devices()[0].platform,
                      "cpus": os.cpu_count(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
                      "malloc": host_memory.malloc_in_use(),
                      "results": results}))


if __name__ == "__main__":
    main()
