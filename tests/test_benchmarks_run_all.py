"""benchmarks/run_all.py: JSON lines -> rows -> table, failures recorded, on fake outputs.

No real benchmark runs here: stdout/stderr are made up in the scripts' formats, and the subprocess
path is exercised with tiny throwaway scripts.
"""

import importlib.util
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load():
    spec = importlib.util.spec_from_file_location("run_all", os.path.join(ROOT, "benchmarks",
                                                                           "run_all.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_all"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


run_all = _load()
bench_rows = sys.modules["bench_rows"]  # the row builders run_all imports from beside it
BENCH = {b.name: b for b in run_all.BENCHMARKS}
HEADER = {"command": "python benchmarks/run_all.py", "date": "2000-01-01 00:00", "machine": "test"}

SAMPLER_OUT = "\n".join(json.dumps({
    "config": name, "params_m": 7.0, "batch": 32, "prompt": 128, "new_tokens": 128,
    "crl_jax_tokens_per_s": ours, "transformers_tokens_per_s": theirs,
    "ratio": round(ours / theirs, 3), "tokens_equal_fraction": 1.0, "crl_jax_gflops": 1.0,
    "matmul_peak_gflops": 10.0, "fraction_of_peak": 0.1, "devices": "cpu", "torch_threads": 1,
}) for name, ours, theirs in (("qwen2-7m", 300.0, 100.0), ("smollm2-135m", 30.0, 40.0)))

RETRIEVAL_OUT = json.dumps({"benchmark": "retrieval", "results": [{
    "bank": "20000x384", "queries": 128, "top_k": 16, "crl_jax_ms": 1.5, "faiss_rerank_ms": 3.0,
    "ratio_crl_jax_over_faiss": 0.5, "faiss_threads": 1, "same_top1": 1.0}], "malloc": "tcmalloc"})

AOT_OUT = "\n".join([
    json.dumps({"topology": "v5p:2x2x1", "chips": 4, "fits": True, "error": None,
                "peak_bytes_per_chip": 80 * 2**30, "hbm_bytes_per_chip": 95.74 * 2**30,
                "compile_s": 12.0, "actor_seq": 16384, "extractor_seq": 16384}),
    json.dumps({"family": "v5p", "smallest_fitting_slice_tried": "v5p:2x2x1"}),
    json.dumps({"topology": "v5e:8x8", "chips": 64, "fits": False, "compile_s": 30.0,
                "error": "RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm",
                "actor_seq": 16384, "extractor_seq": 16384}),
    "",
    "topology  chips  peak GiB/chip   (a text table the parser must skip)",
])


def test_rows_from_script_outputs_ratio_target_and_met():
    rows = run_all.collect(BENCH["sampler"], "python benchmarks/sampler.py", 0, SAMPLER_OUT,
                           "", 12.0)["rows"]
    assert [r["case"].split()[0] for r in rows] == ["qwen2-7m", "smollm2-135m"]
    # 3.0x against a 2.0 target is met; 0.75x against 1.5 is not.
    assert (rows[0]["ratio"], rows[0]["target"], rows[0]["met"]) == (3.0, ">= 2", True)
    assert (rows[1]["ratio"], rows[1]["target"], rows[1]["met"]) == (0.75, ">= 1.5", False)

    (r,) = run_all.collect(BENCH["retrieval"], "c", 0, RETRIEVAL_OUT, "", 1.0)["rows"]
    assert (r["crl_jax"], r["reference"], r["ratio"], r["target"], r["met"]) == (
        1.5, 3.0, 0.5, "<= 1", True)
    # The allocator both sides ran on is part of the figure; unlabelled outputs ran on the system's.
    assert "malloc tcmalloc" in r["notes"] and "malloc system" in rows[0]["notes"]

    fits, oom = run_all.collect(BENCH["aot_tpu"], "c", 0, AOT_OUT, "", 1.0)["rows"]
    assert fits["met"] is True and fits["crl_jax"] == 80.0 and fits["reference"] == 95.74
    assert fits["ratio"] == pytest.approx(80 / 95.74, abs=1e-3)
    assert oom["met"] is False and oom["crl_jax"] is None and "Ran out of memory" in oom["notes"]

    envs_out = "| env | ... (markdown table) |\n" + json.dumps({
        "benchmark": "envs", "seeds": 10, "skipped": [["alfworld/data", "ImportError: no alfworld"]],
        "rows": [{"env": "sokoban/6x6-2box", "expert_success": 1.0, "random_success": 0.1,
                  "expert_turns": 6.0, "random_turns": 28.7, "steps_per_s": 11572.0}]})
    sokoban, skipped = run_all.collect(BENCH["envs"], "c", 0, envs_out, "", 1.0)["rows"]
    assert (sokoban["crl_jax"], sokoban["reference"], sokoban["ratio"]) == (1.0, 0.1, None)
    assert skipped["case"] == "alfworld/data (skipped)" and "no alfworld" in skipped["notes"]


def test_make_row_ratio_and_target_directions():
    assert bench_rows.make_row("b", "c", 2.0, 4.0, "ms", target=("<=", 1.0))["met"] is True
    assert bench_rows.make_row("b", "c", 2.0, 4.0, "ms", target=(">=", 1.0))["met"] is False
    zero = bench_rows.make_row("b", "c", 1.0, 0.0, "x", target=(">=", 1.0))
    assert zero["ratio"] is None and zero["met"] is None  # no ratio against 0, no verdict


def _fake_results():
    """A sampler that worked, a train step that crashed, a retrieval run with no JSON in its
    output, and an env table that timed out."""
    ok = run_all.collect(BENCH["sampler"], "python benchmarks/sampler.py --batch=32", 0,
                         SAMPLER_OUT, "warning: noise\n", 12.0)
    crashed = run_all.collect(BENCH["train_step"], "python benchmarks/train_step.py", 1, "",
                              "Traceback (most recent call last):\n  ...\n"
                              "RuntimeError: out of memory\n\n", 3.0)
    garbled = run_all.collect(BENCH["retrieval"], "python benchmarks/retrieval.py", 0,
                              "no json here\n", "last words\n", 2.0)
    timed_out = run_all.collect(BENCH["envs"], "python benchmarks/envs.py", None, "",
                                "done minihack/x\n", 1800.0, timed_out=True)
    return [ok, crashed, garbled, timed_out]


def test_failures_are_recorded_and_table_keeps_the_rest():
    ok, crashed, garbled, timed_out = results = _fake_results()
    assert ok["status"] == "ok" and ok["error"] is None
    assert crashed["status"] == "failed" and crashed["error"] == "RuntimeError: out of memory"
    assert garbled["status"] == "failed" and "last words" in garbled["error"]
    assert timed_out["status"] == "timeout" and "done minihack/x" in timed_out["error"]
    assert "after 1800 s" in timed_out["error"]  # the benchmark's own limit unless overridden
    framed = run_all.collect(BENCH["envs"], "c", None, "", "E slow compile\n*****\n", 9.0,
                             timed_out=True, timeout_s=5)
    assert framed["error"] == "timed out after 5 s; last stderr line: E slow compile"

    table = run_all.render_markdown(results, HEADER)
    lines = [ln for ln in table.splitlines() if ln.startswith("| ")]
    assert lines[0].startswith("| benchmark | case | crl_jax | reference | unit | ratio | target")
    body = lines[1:]
    assert len(body) == 2 + 3  # two sampler rows, one line per failed benchmark
    cells = [c.strip() for c in body[0].strip("|").split("|")]
    assert cells[:8] == ["sampler", "qwen2-7m B=32 128+128 greedy", "300", "100", "tokens/s",
                         "3", ">= 2", "yes"]
    assert cells[-1] == "`python benchmarks/sampler.py --batch=32`"  # command in first row only
    assert body[1].rstrip().endswith("|  |")
    assert "**FAILED**" in body[2] and "RuntimeError: out of memory" in body[2]
    assert "`python benchmarks/train_step.py`" in body[2]
    assert "**TIMEOUT**" in body[4]
    assert "Failed: train_step, retrieval, envs." in table

    summary = run_all.summary_json(results, HEADER)
    assert summary["failed"] == ["train_step", "retrieval", "envs"]


def test_render_rewrites_table_from_json(tmp_path):
    summary = run_all.summary_json(_fake_results(), HEADER)
    (tmp_path / "results.json").write_text(json.dumps(summary))
    assert run_all.main(["--render", "--out", str(tmp_path)]) == 1  # failures give exit status 1
    assert (tmp_path / "results.md").read_text() == run_all.render_markdown(
        summary["benchmarks"], summary)


def test_run_one_subprocess_ok_failure_and_timeout(tmp_path):
    def script(name, body):
        path = tmp_path / f"{name}.py"
        path.write_text(body)
        return str(path)

    row = json.dumps({"topology": "v5p:2x2x1", "chips": 4, "fits": True, "actor_seq": 1,
                      "extractor_seq": 1})
    good = run_all.Bench("good", script("good", f"print('table line')\nprint({row!r})\n"),
                         (), (), 30, run_all.aot_tpu_rows)
    bad = run_all.Bench("bad", script("bad", "import sys\nsys.exit('boom: no libtpu')\n"),
                        (), (), 30, run_all.aot_tpu_rows)
    slow = run_all.Bench("slow", script("slow", "import sys, time\n"
                                                "print('starting', file=sys.stderr, flush=True)\n"
                                                "time.sleep(60)\n"),
                         (), (), 30, run_all.aot_tpu_rows)
    quiet = lambda *a, **k: None
    res = run_all.run_one(good, quick=False, log=quiet)
    assert res["status"] == "ok" and res["rows"][0]["met"] is True
    res = run_all.run_one(bad, quick=False, log=quiet)
    assert (res["status"], res["returncode"], res["error"]) == ("failed", 1, "boom: no libtpu")
    res = run_all.run_one(slow, quick=False, timeout_s=1.5, log=quiet)
    assert res["status"] == "timeout" and "starting" in res["error"] and res["elapsed_s"] < 10


def test_only_and_quick_commands():
    assert [b.name for b in run_all.select("envs,sampler")] == ["envs", "sampler"]
    with pytest.raises(SystemExit, match="unknown benchmark"):
        run_all.select("sampler,nope")
    for bench in run_all.BENCHMARKS:
        assert os.path.exists(os.path.join(ROOT, bench.script))
        assert run_all.display_command(bench, quick=False).startswith(f"python {bench.script}")
        assert bench.quick_args != bench.args


def test_only_run_keeps_the_other_benchmarks_rows():
    ok, crashed, _, _ = _fake_results()
    previous = run_all.summary_json([ok, crashed], dict(HEADER, quick=False))
    rerun = dict(crashed, status="ok", error=None, rows=[], date="2000-02-02 00:00")
    merged = run_all.merge_results(previous, [rerun], quick=False)
    # The rerun replaces its old result; the other keeps its rows and gets the old table's date.
    assert [r["name"] for r in merged] == ["sampler", "train_step"]
    assert merged[0]["rows"] == ok["rows"] and merged[0]["date"] == HEADER["date"]
    assert merged[1] is rerun
    table = run_all.render_markdown(merged, dict(HEADER, date="2000-02-02 00:00"))
    assert f"Kept from earlier runs (not rerun by this command): sampler (measured " \
           f"{HEADER['date']})." in table
    # A table made at the other sizes is not mixed in, nor is a missing one.
    assert run_all.merge_results(dict(previous, quick=True), [rerun], quick=False) == [rerun]
    assert run_all.merge_results(None, [rerun], quick=False) == [rerun]


@pytest.mark.parametrize("flags, expected", [
    ("fpu sse2 avx avx2 fma avx512f avx512bw", "Some CPU 9000 (x86_64, AVX-512)"),
    ("fpu sse2 avx avx2 fma", "Some CPU 9000 (x86_64, AVX2)"),
    ("fpu sse2", "Some CPU 9000 (x86_64)"),
])
def test_the_table_names_the_cpu_and_its_widest_vector_extension(tmp_path, monkeypatch, flags,
                                                                  expected):
    """Ratios against PyTorch move with the CPU, so the header says which one made them."""
    monkeypatch.setattr(run_all.platform, "machine", lambda: "x86_64")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU 9000\n"
                       f"flags\t\t: {flags}\n\nprocessor\t: 1\nmodel name\t: Some CPU 9000\n")
    assert run_all.cpu_description(str(cpuinfo)) == expected
    assert run_all.cpu_description(str(tmp_path / "missing")) == "x86_64"
