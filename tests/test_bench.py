"""CPU tests of the benchmark: benchmarks/bench_cufft.py (the user-facing script) and the
package benchmarks/fftconv_bench it runs."""
import collections
import csv
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers import is_png

_BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "benchmarks")
_ENTRY_POINT = os.path.join(_BENCHMARKS, "bench_cufft.py")


@pytest.fixture(scope="module")
def bench():
    """The package's modules: bench.cli, bench.methods, bench.guard, ..."""
    if _BENCHMARKS not in sys.path:
        sys.path.insert(0, _BENCHMARKS)
    from fftconv_bench import cli, guard, methods, outputs, report, runner, timing
    return SimpleNamespace(cli=cli, guard=guard, methods=methods, outputs=outputs, report=report,
                           runner=runner, timing=timing)


def _monarch_importable() -> bool:
    try:
        import monarch_fftconv as mf
        return hasattr(mf, "fftconv")
    except Exception:
        return False


# ---------------------------------------------------------------- CLI

def test_defaults(bench):
    a = bench.cli.parse_args([])
    assert a.shapes is None and a.preset is None and not a.backward and a.out == "bench_out"
    cfg = bench.cli.resolve_config(bench.cli.parse_args(["--device", "cpu"]))
    assert cfg["device"] == "cpu" and cfg["shapes"] == bench.cli.CPU_DEFAULT_SHAPES
    assert cfg["reps"] == bench.cli.CPU_DEFAULT_REPS
    if torch.cuda.is_available():
        cfg = bench.cli.resolve_config(bench.cli.parse_args([]))
        assert cfg["shapes"] == [(16, 256, 8192)] and cfg["reps"] == 50


@pytest.mark.parametrize("preset,expected", [
    ("seed", [(16, 256, 8192)]),
    ("lengths", [(16, 256, L) for L in (1024, 2048, 4096, 8192, 16384)]),
    ("hyena", [(64, 768, 8192)]),
])
def test_presets(bench, preset, expected):
    cfg = bench.cli.resolve_config(bench.cli.parse_args(["--preset", preset, "--device", "cpu"]))
    assert cfg["shapes"] == expected


def test_long_preset_holds_the_same_work_at_every_length(bench):
    """Issue #11's sweep: L from 16384 to 4M, each shape with 2^27 input elements."""
    cfg = bench.cli.resolve_config(bench.cli.parse_args(["--preset", "long", "--device", "cpu"]))
    lengths = [L for _, _, L in cfg["shapes"]]
    assert lengths == sorted(lengths) and lengths[0] == 16384 and lengths[-1] == 4 * 2**20
    assert all(b * c * L == 2**27 for b, c, L in cfg["shapes"])


def test_shapes_parse(bench):
    a = bench.cli.parse_args(["--shapes", "16x256x8192,16x256x1024", "--backward", "--reps", "31",
                          "--compile", "--energy", "--out", "x"])
    assert a.shapes == [(16, 256, 8192), (16, 256, 1024)]
    assert a.backward and a.compile and a.energy and a.reps == 31 and a.out == "x"
    assert bench.cli.parse_shapes(" 2X4X2048 ,") == [(2, 4, 2048)]


@pytest.mark.parametrize("spec", ["16x256", "16x256x8192x2", "axbxc", "16x0x8192", "16x-1x8", "", ","])
def test_bad_shape_raises_clear_error(bench, spec):
    with pytest.raises(ValueError, match="BxCxL|expected"):
        bench.cli.parse_shapes(spec)


def test_bad_shape_cli_exits_with_message(bench, capsys):
    with pytest.raises(SystemExit) as ei:
        bench.cli.parse_args(["--shapes", "16x256"])
    assert ei.value.code == 2
    assert "BxCxL" in capsys.readouterr().err


def test_shapes_and_preset_are_exclusive(bench):
    with pytest.raises(SystemExit):
        bench.cli.parse_args(["--shapes", "1x2x256", "--preset", "seed"])


def test_cpu_runs_one_thread_unless_told(bench):
    """A core another process holds stalls each parallel region of a multi-threaded host run."""
    def config(*argv):
        return bench.cli.resolve_config(bench.cli.parse_args(["--device", "cpu", *argv]))
    assert config()["threads"] == 1 and config("--threads", "2")["threads"] == 2
    assert config()["warmup_seconds"] == bench.timing.CPU_WARMUP_SECONDS > 0
    assert config("--quick")["warmup_seconds"] == 0


def test_rows_are_named_for_the_fft_library_of_the_device(bench):
    assert bench.methods.fft_library("cuda") == "cuFFT"
    host = bench.methods.fft_library("cpu")
    assert host == ("MKL" if torch.backends.mkl.is_available() else "pocketfft")
    names = [m.name for m in bench.methods.make_methods("cpu")]
    assert f"{host.lower()}-tuned" in names and not any("cufft" in n for n in names)
    assert "cufft-tuned" in [m.name for m in bench.methods.make_methods("cuda")]


def test_cpu_header_names_the_cpu_and_no_cuda(bench, monkeypatch):
    """A CUDA build of torch on a CPU run: the run used no CUDA, so no CUDA version is shown."""
    monkeypatch.setattr(torch.version, "cuda", "97.5")
    env = bench.outputs.environment("cpu")
    env["fft_library"] = bench.methods.fft_library("cpu")
    assert env["cuda_version"] is None
    header = "\n".join(bench.report.header_lines(env, "cpu"))
    assert "97.5" not in header and bench.outputs.cpu_name() in header
    assert f"torch.fft ({env['fft_library']})" in header and "cuFFT" not in header


def test_entry_point_is_the_package_main(bench):
    spec = importlib.util.spec_from_file_location("bench_cufft_entry", _ENTRY_POINT)
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    assert entry.main is bench.cli.main


def test_entry_point_runs_as_a_script(tmp_path):
    # As benchmarks/run_gpu.sh calls it: a plain script run, from the repository root.
    proc = subprocess.run(
        [sys.executable, _ENTRY_POINT, "--quick", "--device", "cpu", "--no-plots",
         "--methods", "reference", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=os.path.dirname(_BENCHMARKS))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "reference" in proc.stdout and "CPU FIGURES" in proc.stdout
    assert json.loads((tmp_path / "results.json").read_text())["results"][0]["status"] == "ok"


# ---------------------------------------------------------------- validity guard

def test_invalid_guard(bench):
    floor = 1e-3
    assert bench.guard.validate_time(0.5e-3, floor) == "INVALID"     # faster than moving the bytes
    assert bench.guard.validate_time(0.0, floor) == "INVALID"
    assert bench.guard.validate_time(float("nan"), floor) == "INVALID"
    assert bench.guard.validate_time(2e-3, floor) == "OK"
    assert bench.guard.validate_time(floor, floor) == "OK"
    assert bench.guard.validate_time(1e-3, None) == "UNCHECKED"


def test_invalid_row_gets_no_speedup(bench):
    rows = [dict(method="reference", status="ok", validity="OK", median_ms=2.0, shape="1x1x8",
                 pass_="fwd")]
    row = dict(shape="1x1x8", B=1, C=1, L=8, **{"pass": "fwd"}, reps=3, n_buffers=2,
               l2_flush=False, floor_ms=1.0, method="fake", backend="x", precision="fp32",
               status="ok", median_ms=0.5, iqr_ms=0.0, validity=bench.guard.validate_time(0.5e-3, 1e-3),
               speedup_vs_reference=None, allclose=True, rel_err=0.0)
    assert row["validity"] == "INVALID"
    table = bench.report.format_table([row], bench.timing.MAX_SPREAD)
    assert "INVALID" in table
    assert "4.00x" not in table
    del rows


def test_precisions_and_budgets_come_from_the_package(bench):
    from monarch_fftconv.policy import ERROR_BUDGETS, PRECISIONS
    names = [m.name for m in bench.methods.make_methods("cpu")]
    assert [n for n in names if n.startswith("monarch[")] == [f"monarch[{p}]" for p in PRECISIONS]
    budget = ERROR_BUDGETS["bf16"]
    assert bench.guard.error_budget_fields("monarch", "bf16", 0.5 * budget) == {
        "error_budget": budget, "within_error_budget": True}
    assert bench.guard.error_budget_fields("monarch", "bf16", 2 * budget)["within_error_budget"] is False
    assert bench.guard.error_budget_fields("monarch", "bf16", float("nan"))["within_error_budget"] is False
    assert bench.guard.error_budget_fields("reference", "fp32", 0.0)["error_budget"] is None


def test_min_bytes_and_flops(bench):
    assert bench.guard.min_bytes(16, 256, 8192, backward=False) == 4 * (2 * 16 * 256 * 8192 + 256 * 8192)
    assert bench.guard.min_bytes(1, 1, 8, backward=True) == 4 * (4 * 8 + 2 * 8)
    f_ref = bench.methods.torch_fft_flops(16, 256, 8192, filter_fft=True, backward=False)
    f_tuned = bench.methods.torch_fft_flops(16, 256, 8192, filter_fft=False, backward=False)
    assert f_ref > f_tuned > 0
    assert bench.methods.torch_fft_flops(16, 256, 8192, filter_fft=True, backward=True) > f_ref


def test_measure_error(bench):
    ref = torch.randn(2, 3, 64, dtype=torch.float64)
    e = bench.guard.measure_error(ref.float(), ref)
    assert e["rel_err"] < 1e-6 and e["allclose"]
    e = bench.guard.measure_error(ref + 1.0, ref)
    assert e["rel_err"] > 0.1 and not e["allclose"]
    e = bench.guard.measure_error(torch.full_like(ref, float("nan")), ref)
    assert not e["allclose"]


def test_reference_matches_direct_causal_conv(bench):
    torch.manual_seed(0)
    u = torch.randn(2, 3, 16, dtype=torch.float64)
    k = torch.randn(3, 16, dtype=torch.float64)
    direct = torch.zeros_like(u)
    for t in range(16):
        for s in range(t + 1):
            direct[..., t] += k[:, s] * u[..., t - s]
    torch.testing.assert_close(bench.methods.reference_conv(u, k), direct)


def test_backward_methods_accumulate_into_grad(bench):
    torch.manual_seed(0)
    u, k, g = torch.randn(1, 2, 32), torch.randn(2, 32), torch.randn(1, 2, 32)
    by = {m.name: m for m in bench.methods.make_methods("cpu", backward=True)}
    assert by["reference"].train_step == "autograd.grad"
    assert by["reference.backward"].train_step == "backward+accumulate"
    _, grad_u, grad_k = by["reference"].build(u, k, g)()
    step = by["reference.backward"].build(u, k, g)
    _, acc_u, acc_k = step()
    torch.testing.assert_close(acc_u, grad_u)
    torch.testing.assert_close(acc_k, grad_k)
    _, acc_u2, acc_k2 = step()                   # the same leaves: their .grad keeps adding up
    torch.testing.assert_close(acc_u2, 2 * grad_u)
    torch.testing.assert_close(acc_k2, 2 * grad_k)
    assert not any(m.name.endswith(".backward") for m in bench.methods.make_methods("cpu"))


def test_module_backward_accumulates_into_the_filter_grad(bench):
    torch.manual_seed(0)
    u, k, g = torch.randn(1, 2, 32), torch.randn(2, 32) / 32 ** 0.5, torch.randn(1, 2, 32)
    step = next(m for m in bench.methods.make_methods("cpu", backward=True)
                if m.name == "monarch-module.backward").build(u, k, g)
    _, _, first = step()
    first = first.clone()
    _, _, second = step()
    torch.testing.assert_close(second, 2 * first)


def test_both_clocks_time_every_rep(bench):
    calls = []

    def work():
        calls.append(1)
        return torch.randn(64).sum()
    for clock in (bench.timing.time_back_to_back, bench.timing.time_per_call_latency):
        calls.clear()
        times = clock([work, work], reps=5, device="cpu")
        assert len(times) == 5 and len(calls) == 5
        assert all(0 < t < float("inf") for t in times)


def _busy_for(seconds):
    """Keep the CPU busy for `seconds` (sleep would hand the core to the scheduler's whims)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_warm_up_outlasts_a_first_call_plateau(bench):
    """Calls that run at 4 ms for the process's first 0.3 s, then at 0.3 ms (first-call costs;
    a fixed 10-call warm-up timed the plateau, and its windows agree with each other): the
    warm-up's minimum time outlasts it, and the times after it are the steady ones."""
    start = []

    def call():
        start.append(start[0] if start else time.perf_counter())
        _busy_for(0.004 if time.perf_counter() - start[0] < 0.3 else 0.0003)
    warmed = bench.timing.warm_up([call], 10, "cpu", min_seconds=0.5)
    assert warmed["seconds"] >= 0.5 and warmed["settled"]
    times = bench.timing.time_back_to_back([call], reps=9, device="cpu")
    assert statistics.median(times) < 0.001


def test_warm_up_waits_until_the_times_settle(bench):
    """Calls whose time decays towards 0.5 ms by 20% of its excess per call: the warm-up goes
    on past its 10 calls until two windows agree, so the measured median is the steady time."""
    made = []

    def call():
        made.append(1)
        _busy_for(0.0005 + 0.008 * 0.8 ** len(made))
    warmed = bench.timing.warm_up([call], 10, "cpu", min_seconds=0.0)
    assert warmed["settled"] and warmed["calls"] > 10 and warmed["calls"] == len(made)
    times = bench.timing.time_back_to_back([call], reps=9, device="cpu")
    assert statistics.median(times) < 0.0005 * 1.2


def test_warm_up_that_never_settles_stops_and_says_so(bench):
    made = []

    def call():   # 30% slower every call: no two windows agree
        made.append(1)
        _busy_for(1e-5 * 1.3 ** min(len(made), 40))
    warmed = bench.timing.warm_up([call], 1, "cpu", min_seconds=0.0, max_seconds=0.3)
    assert not warmed["settled"] and 0.3 <= warmed["seconds"] < 5


def test_spread_verdict(bench):
    summary = bench.timing.summarize([1.0, 1.0, 2.0, 3.0, 9.0])   # median 2, IQR 2
    assert bench.timing.spread(summary) == pytest.approx(1.0)
    assert bench.guard.validate_spread(1.0, max_spread=0.25) == "NOISY"
    assert bench.guard.validate_spread(0.25, max_spread=0.25) == "OK"
    assert bench.guard.validate_spread(None) == "UNCHECKED"
    assert bench.timing.relative_gap(1.0, 1.5) == pytest.approx(0.5)


def test_other_load_verdict(bench):
    """Several threads need free cores: other processes taking them make the row NOISY; one
    thread's median survives sharing a core."""
    verdict = bench.guard.validate_other_load
    assert verdict(1.0, threads=2, cores=2) == "NOISY"
    assert verdict(0.1, threads=2, cores=2) == "OK"
    assert verdict(1.5, threads=2, cores=4) == "OK" and verdict(2.5, threads=2, cores=4) == "NOISY"
    assert verdict(1.9, threads=1, cores=2) == "OK"
    assert verdict(None, threads=2, cores=2) == "UNCHECKED"


def test_other_load_sees_another_process(bench):
    if bench.timing.busy_cpu_seconds() is None:
        pytest.skip("no /proc/stat")
    load = bench.timing.OtherLoad()
    busy = subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                           "while time.process_time() - t < 0.6: pass"], timeout=60)
    assert busy.returncode == 0
    # the child's 0.6 s of CPU, over the ~0.6-1 s it took (imports included): at least ~0.4 core
    assert load.other_cores() > 0.4


def _timed_row(method, median_ms, validity, reference=False):
    return {"method": method, "family": "reference" if reference else "monarch", "train_step": None,
            "status": "ok", "validity": validity, "median_ms": median_ms, "latency_median_ms": median_ms}


def test_noisy_rows_get_no_speedup(bench):
    rows = bench.guard.assign_speedups([_timed_row("reference", 2.0, "OK", reference=True),
                                        _timed_row("a", 1.0, "OK"), _timed_row("b", 0.1, "NOISY")])
    assert [r["speedup_vs_reference"] for r in rows] == [1.0, 2.0, None]
    rows = bench.guard.assign_speedups([_timed_row("reference", 2.0, "NOISY", reference=True),
                                        _timed_row("a", 1.0, "OK")])
    assert [r["speedup_vs_reference"] for r in rows] == [None, None]   # against what?


def test_noisy_rows_are_marked_in_table_json_and_plots(bench, tmp_path, capsys):
    # Any two host timings differ: a threshold of 1e-9 makes every row NOISY.
    res = bench.cli.main(["--quick", "--device", "cpu", "--methods", "reference,monarch[fp32]",
                          "--max-spread", "1e-9", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    meta = json.loads((tmp_path / "results.json").read_text())
    assert meta["max_spread"] == 1e-9 and meta["n_noisy"] == 2
    for r in meta["results"]:
        assert r["validity"] == "NOISY" and r["speedup_vs_reference"] is None
        assert r["spread"] > 1e-9 and "spread" in r["noisy_because"]
    assert "NOISY: reference (spread" in out and "above 0% of the median" in out
    assert {p.name for p in map(Path, res["plots"])} >= {"speedup_fwd.png", "time_vs_L_fwd.png"}


def test_plots_say_what_they_leave_out(bench):
    import matplotlib.pyplot as plt

    from fftconv_bench import plots
    rows = [{"method": "monarch[fp32]", "status": "ok", "median_ms": 1.0, "validity": "NOISY"},
            {"method": "monarch[bf16]", "status": "ok", "median_ms": 1.0, "validity": "OK",
             "same_computation_as": "monarch[fp32]"}]
    fig = plt.figure()
    assert plots._footnote(fig, rows, {"max_spread": 0.25}) > 0
    text = fig.texts[0].get_text()
    plt.close(fig)
    assert "same code as a drawn row: monarch[bf16]" in text and "NOISY (spread > 25%" in text
    assert "monarch[fp32]" in text.split("NOISY")[1]
    assert plots._label(rows, "monarch[fp32]") == "monarch[fp32] = monarch[bf16]"


def _same_code_row(method, entry, kernel, status="ok", median_ms=1.0):
    return {"method": method, "entry": entry, "train_step": None, "backend": "torch.fft",
            "kernel": kernel, "status": status, "median_ms": median_ms,
            "latency_median_ms": median_ms, "validity": "OK"}


def test_rows_that_run_the_same_code_are_marked(bench):
    row = _same_code_row
    rows = [row("monarch[fp32]", "fftconv", "k32"), row("monarch[tf32]", "fftconv", "k32", median_ms=1.2),
            row("monarch[bf16]", "fftconv", "tc"), row("monarch[fp16]", "fftconv", "k32", "error"),
            row("monarch-module", "FFTConv", "k32")]
    bench.guard.mark_same_computations(rows)
    assert [r["same_computation_as"] for r in rows] == [None, "monarch[fp32]", None, None, None]
    assert all(r["validity"] == "OK" for r in rows)  # 1.2 against 1.0: within the 25% spread


def test_the_same_code_timed_far_apart_is_noisy(bench):
    """One computation timed 0.59 and 1.75 ms in one run (another process started between the
    rows): the later row is NOISY and gets no speedup (the earlier one stays as it was logged)."""
    rows = [_same_code_row("reference", "reference", "ref"), _same_code_row("monarch[fp32]", "fftconv", "k32", median_ms=0.59),
            _same_code_row("monarch[bf16]", "fftconv", "k32", median_ms=1.75)]
    rows[0]["family"] = "reference"
    bench.guard.mark_same_computations(rows, max_spread=0.25)
    bench.guard.assign_speedups(rows)
    assert [r["validity"] for r in rows] == ["OK", "OK", "NOISY"]
    assert "machine changed" in rows[2]["noisy_because"] and "monarch[fp32]" in rows[2]["noisy_because"]
    assert rows[2]["speedup_vs_reference"] is None and rows[1]["speedup_vs_reference"] is not None
    # The runner marks the shape's rows again after each later row: the reason stays one reason.
    rows.append(_same_code_row("monarch[fp16]", "fftconv", "k32", median_ms=0.6))
    bench.guard.mark_same_computations(rows, max_spread=0.25)
    assert rows[2]["noisy_because"].count("machine changed") == 1, rows[2]["noisy_because"]


def test_on_cpu_the_precisions_are_one_computation(bench, tmp_path):
    """On the host every monarch precision runs the same torch.fft code: one computation, the
    repeats marked, printed '=monarch[fp32]' and left out of the plots."""
    res = bench.cli.main(["--quick", "--device", "cpu", "--no-plots", "--out", str(tmp_path)])
    by = {r["method"]: r for r in res["rows"]}
    for p in ("tf32", "bf16", "fp16"):
        assert by[f"monarch[{p}]"]["same_computation_as"] == "monarch[fp32]"
    for m in ("reference", _tuned("cpu"), "monarch[fp32]", "monarch-module"):
        assert by[m]["same_computation_as"] is None, m
    assert "=monarch[fp32]" in bench.report.format_table(res["rows"], bench.timing.MAX_SPREAD)


def test_worst_validity(bench):
    worst = bench.guard.worst_validity
    assert worst("OK", "INVALID") == "INVALID" and worst("INVALID", "OK") == "INVALID"
    assert worst("OK", "UNCHECKED") == "OK" and worst("UNCHECKED", "UNCHECKED") == "UNCHECKED"
    assert worst("OK", "NOISY") == "NOISY" and worst("NOISY", "INVALID") == "INVALID"


def test_failing_method_is_an_error_row(bench, tmp_path, monkeypatch):
    real = bench.runner.make_methods

    def with_broken(device, **kw):
        ms = real(device, **kw)

        def boom(u, k, g):
            raise RuntimeError("boom from test")
        ms.append(bench.methods.Method("broken", "test", None, "broken", build=boom,
                                       describe=lambda u, k: {"backend": "none"},
                                       flops=lambda *a: None))
        return ms
    monkeypatch.setattr(bench.runner, "make_methods", with_broken)
    res = bench.cli.main(["--quick", "--device", "cpu", "--no-plots", "--methods", "reference",
                          "--out", str(tmp_path)])
    rows = {r["method"]: r for r in res["rows"]}
    assert rows["broken"]["status"] == "error" and "boom from test" in rows["broken"]["error"]
    assert rows["reference"]["status"] == "ok"


# ---------------------------------------------------------------- end-to-end quick CPU run

TIMING_FIELDS = ("median_ms", "q1_ms", "q3_ms", "min_ms", "max_ms", "latency_median_ms",
                 "latency_q1_ms", "latency_q3_ms", "latency_min_ms", "latency_max_ms")


def _positive_finite(value) -> bool:
    return isinstance(value, (int, float)) and 0 < value < float("inf")


def _check_meta(meta, device):
    for key in ("device", "torch_version", "cuda_version", "gpu_name", "copy_bandwidth_gbps",
                "results", "reps", "shapes", "source_digest", "timing"):
        assert key in meta, key
    assert meta["device"] == device
    assert meta["copy_bandwidth_gbps"] > 0
    if device == "cpu":
        assert "cpu figures" in meta["note"].lower() and "not gpu" in meta["note"].lower()


def _check_row(r, backward):
    assert r["status"] in ("ok", "error")
    assert r["pass"] == ("fwd+bwd" if backward else "fwd")
    if r["status"] != "ok":
        return
    # Both timings, back-to-back (throughput) and per-call latency, on every row.
    for field in TIMING_FIELDS:
        assert _positive_finite(r[field]), (r["method"], field, r[field])
    assert r["iqr_ms"] >= 0 and r["latency_iqr_ms"] >= 0
    assert r["validity"] in ("OK", "NOISY", "INVALID", "UNCHECKED")
    assert r["spread"] >= 0 and (r["noisy_because"] is not None) == (r["validity"] == "NOISY")
    assert r["warmup_calls"] >= r["warmup"] and isinstance(r["warmup_settled"], bool)
    assert r["rel_err"] is not None and r["rel_err"] >= 0
    assert isinstance(r["allclose"], bool)
    assert r["floor_ms"] > 0 and r["gbps"] > 0
    if r["validity"] in ("INVALID", "NOISY"):
        assert r["speedup_vs_reference"] is None
        assert r["latency_speedup_vs_reference"] is None


def _tuned(device):
    """The tuned torch.fft method, named for the library torch.fft runs on `device`."""
    from fftconv_bench.methods import fft_library
    return f"{fft_library(device).lower()}-tuned"


def _check_rows(rows, backward, device):
    methods = {r["method"] for r in rows}
    assert {"reference", _tuned(device)} <= methods
    assert {f"monarch[{p}]" for p in ("fp32", "tf32", "bf16", "fp16")} <= methods
    for r in rows:
        _check_row(r, backward)
    by = {r["method"]: r for r in rows}
    for m in ("reference", _tuned(device)):
        assert by[m]["status"] == "ok" and by[m]["allclose"] and by[m]["rel_err"] < 1e-5
    # The reference against itself: 1, unless its timing is untrusted (then no speedup at all).
    trusted = by["reference"]["validity"] in ("OK", "UNCHECKED")
    for field in ("speedup_vs_reference", "latency_speedup_vs_reference"):
        assert by["reference"][field] == (pytest.approx(1.0) if trusted else None)
    if _monarch_importable():
        assert by["monarch[fp32]"]["status"] == "ok", by["monarch[fp32]"].get("error")
        assert by["monarch[fp32]"]["allclose"]
        from monarch_fftconv.policy import ERROR_BUDGETS
        for r in rows:
            if r["family"] == "monarch" and r["status"] == "ok":
                assert r["error_budget"] == ERROR_BUDGETS[r["precision"]]
                assert isinstance(r["within_error_budget"], bool)


def _check_csv(path, rows):
    with open(path, newline="") as f:
        crow = list(csv.reader(f))
    assert crow[0][:3] == ["shape", "B", "C"] and "median_ms" in crow[0]
    assert "latency_median_ms" in crow[0] and "train_step" in crow[0]
    assert len(crow) == 1 + len(rows)
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["status"] == "ok":
                assert all(_positive_finite(float(r[field])) for field in TIMING_FIELDS), r


def _check_outputs(out, device, backward=False, plots=True):
    meta = json.loads((out / "results.json").read_text())
    _check_meta(meta, device)
    _check_rows(meta["results"], backward, device)
    _check_csv(out / "results.csv", meta["results"])
    assert len(_jsonl_rows(out / "results.jsonl")) == len(meta["results"])   # the partial log
    if plots:
        pngs = sorted(out.glob("*.png"))
        names = {p.name.split("_f")[0] for p in pngs}
        assert {"time_vs_L", "speedup", "error"} <= names, names
        for p in pngs:
            assert is_png(p)
    return meta


def test_quick_cpu_run_writes_outputs(bench, tmp_path, capsys):
    res = bench.cli.main(["--quick", "--device", "cpu", "--out", str(tmp_path)])
    stdout = capsys.readouterr().out
    assert "CPU FIGURES" in stdout and "b2b ms" in stdout and "latency ms" in stdout
    meta = _check_outputs(tmp_path, "cpu")
    assert meta["shapes"] == [list(s) for s in bench.cli.QUICK_SHAPES]
    assert res["paths"]["json"].endswith("results.json")
    assert not any(r["method"].endswith(".backward") for r in meta["results"])
    assert {r["train_step"] for r in meta["results"]} == {None}


def test_quick_cpu_backward(bench, tmp_path):
    bench.cli.main(["--quick", "--device", "cpu", "--backward", "--shapes", "1x2x128,1x2x256",
                    "--out", str(tmp_path)])
    meta = _check_outputs(tmp_path, "cpu", backward=True)
    by = {(r["shape"], r["method"]): r for r in meta["results"]}
    for shape in ("1x2x128", "1x2x256"):
        for name in ("reference", "reference.backward"):
            # .backward: grads accumulated into .grad; the error check sees the first call's.
            ref = by[(shape, name)]
            assert ref["grad_u_rel_err"] < 1e-5 and ref["grad_k_allclose"], name
        assert by[(shape, "reference")]["train_step"] == "autograd.grad"
        assert by[(shape, "reference.backward")]["train_step"] == "backward+accumulate"
        ref = by[(shape, "reference.backward")]
        assert ref["speedup_vs_reference"] == (pytest.approx(1.0) if ref["validity"] == "OK" else None)
        assert (shape, "monarch-module.backward") in by
        assert {f"monarch[{p}].backward" for p in ("fp32", "tf32", "bf16", "fp16")} <= {
            m for (s, m) in by if s == shape}


def _jsonl_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rows_are_logged_as_they_finish(bench, tmp_path):
    res = bench.cli.main(["--quick", "--device", "cpu", "--no-plots", "--backward",
                          "--out", str(tmp_path)])
    logged = _jsonl_rows(tmp_path / "results.jsonl")
    assert [(r["shape"], r["method"]) for r in logged] == [
        (r["shape"], r["method"]) for r in res["rows"]]
    final = json.loads((tmp_path / "results.json").read_text())["results"]
    for partial, done in zip(logged, final):
        for field in ("median_ms", "latency_median_ms", "rel_err", "speedup_vs_reference"):
            assert partial[field] == done[field], (partial["method"], field)


def test_interrupted_run_leaves_its_finished_rows(bench, tmp_path, monkeypatch):
    real = bench.runner.measure_method
    measured = []

    def interrupt_at_the_third(m, x, s):
        if len(measured) == 2:
            raise KeyboardInterrupt
        measured.append(m.name)
        return real(m, x, s)
    monkeypatch.setattr(bench.runner, "measure_method", interrupt_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        bench.cli.main(["--quick", "--device", "cpu", "--no-plots", "--out", str(tmp_path)])
    assert [r["method"] for r in _jsonl_rows(tmp_path / "results.jsonl")] == measured
    with open(tmp_path / "results.csv", newline="") as f:
        assert [r["method"] for r in csv.DictReader(f)] == measured
    assert not (tmp_path / "results.json").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_quick_gpu_run(bench, tmp_path):
    bench.cli.main(["--quick", "--device", "cuda", "--out", str(tmp_path)])
    meta = _check_outputs(tmp_path, "cuda")
    assert meta["gpu_name"]
    ref = next(r for r in meta["results"] if r["method"] == "reference")
    assert ref["kernel_launches"] is None or ref["kernel_launches"] >= 2
    assert ref["peak_extra_mb"] is not None and ref["peak_extra_mb"] >= 0


def test_invalid_guard_wired_into_run(bench, tmp_path, monkeypatch, capsys):
    # A (fake) copy bandwidth of 1 kB/s puts every shape's floor far above any real time:
    # every row must come out INVALID, with no speedup anywhere.
    monkeypatch.setattr(bench.runner, "copy_bandwidth", lambda device, nbytes=0, reps=0: 1e3)
    res = bench.cli.main(["--quick", "--device", "cpu", "--no-plots", "--methods",
                          f"reference,{_tuned('cpu')}", "--out", str(tmp_path)])
    assert "INVALID" in capsys.readouterr().out
    for r in res["rows"]:
        assert r["validity"] == "INVALID" and r["speedup_vs_reference"] is None
        assert r["latency_speedup_vs_reference"] is None
    meta = json.loads((tmp_path / "results.json").read_text())
    assert meta["n_invalid"] == 2


def test_source_digest_tracks_the_kernel_sources(bench, tmp_path):
    (tmp_path / "monarch_fftconv").mkdir()
    (tmp_path / "monarch_fftconv" / "csrc").mkdir()
    (tmp_path / "monarch_fftconv" / "a.py").write_text("x = 1\n")
    (tmp_path / "monarch_fftconv" / "csrc" / "k.cu").write_text("// v1\n")
    first = bench.outputs.source_digest(tmp_path)
    assert len(first) == 12 and first == bench.outputs.source_digest(tmp_path)
    (tmp_path / "monarch_fftconv" / "csrc" / "k.cu").write_text("// v2\n")
    second = bench.outputs.source_digest(tmp_path)
    assert second != first
    # the kernel tree's subdirectories count too
    (tmp_path / "monarch_fftconv" / "csrc" / "tc").mkdir()
    (tmp_path / "monarch_fftconv" / "csrc" / "tc" / "h.cuh").write_text("// v1\n")
    third = bench.outputs.source_digest(tmp_path)
    assert third != second
    (tmp_path / "monarch_fftconv" / "csrc" / "tc" / "h.cuh").write_text("// v2\n")
    assert bench.outputs.source_digest(tmp_path) != third


def test_gpu_scripts_parse():
    """The device scripts run only on the GPU machine: CI at least parses them."""
    scripts = sorted(Path(_BENCHMARKS).glob("*.sh"))
    assert scripts
    for script in scripts:
        subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.skipif(shutil.which("xz") is None, reason="needs xz to pack a kit")
def test_gpu_setup_names_a_carried_cudnn_kit(tmp_path):
    """cudnn_kit_env.sh (sourced by gpu_setup.sh): a carried kit tarball is unpacked once and
    named by MONARCH_FFTCONV_CUDNN_KIT; an unpacked .cudnn_kit is named as it is; none, nothing."""
    import tarfile

    def kit_variable(repo):
        env = {k: v for k, v in os.environ.items() if k != "MONARCH_FFTCONV_CUDNN_KIT"}
        env["CUDNN_KIT_UNPACK_DIR"] = str(tmp_path / "unpacked")
        script = Path(_BENCHMARKS) / "cudnn_kit_env.sh"
        proc = subprocess.run(["bash", "-c", f'source "{script}" >/dev/null; echo "$MONARCH_FFTCONV_CUDNN_KIT"'],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=60, check=True)
        return proc.stdout.strip()

    packed, unpacked_repo, bare = tmp_path / "packed", tmp_path / "unpacked_repo", tmp_path / "bare"
    for repo in (packed, unpacked_repo, bare):
        repo.mkdir()
    (unpacked_repo / ".cudnn_kit" / "lib").mkdir(parents=True)
    (unpacked_repo / ".cudnn_kit" / "lib" / "libcudnn_ext.so.9").write_bytes(b"ext")
    (packed / ".cudnn_kit").mkdir()
    with tarfile.open(packed / ".cudnn_kit" / "cudnn_kit.tar.xz", "w:xz") as tar:
        tar.add(unpacked_repo / ".cudnn_kit" / "lib", arcname="lib")
    assert kit_variable(packed) == str(tmp_path / "unpacked")
    assert (tmp_path / "unpacked" / "lib" / "libcudnn_ext.so.9").read_bytes() == b"ext"
    assert kit_variable(unpacked_repo) == str(unpacked_repo / ".cudnn_kit")
    assert kit_variable(bare) == ""


def test_profile_set_archives_each_profile_with_its_environment(tmp_path):
    """profile_set.sh runs profile_ncu.sh once per spec, with that spec's environment, and
    archives what each wrote (without the large .ncu-rep); here profile_ncu.sh is a stub."""
    import tarfile

    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "profile_set.sh").write_text((Path(_BENCHMARKS) / "profile_set.sh").read_text())
    (bench / "profile_ncu.sh").write_text(
        'echo "PRECISION=$PRECISION KERNEL=$KERNEL" > "$OUT/details.txt"; touch "$OUT/prof.ncu-rep"\n')
    out = tmp_path / "out"
    subprocess.run(["bash", str(bench / "profile_set.sh"), "one PRECISION=bf16 KERNEL=regex:a", "two PRECISION=fp32 KERNEL=b"],
                   check=True, env={**os.environ, "OUT": str(out)}, capture_output=True, timeout=60)
    with tarfile.open(out / "profiles.tgz") as archive:
        names = archive.getnames()
        details = {n.split("/")[-2]: archive.extractfile(n).read().decode().strip()
                   for n in names if n.endswith("details.txt")}
    assert details == {"one": "PRECISION=bf16 KERNEL=regex:a", "two": "PRECISION=fp32 KERNEL=b"}
    assert not any(n.endswith(".ncu-rep") for n in names)


def test_tensor_core_rows_name_the_kernel_the_op_runs(bench, monkeypatch):
    """monarch-tc[p] runs the tensor-core kernel through the op even where fftconv (and so
    explain()) would take the fp32 kernel: its row then carries the tensor-core kernel's name
    and flops; elsewhere explain()'s description stands."""
    mf = bench.methods.mf
    from monarch_fftconv.planner import plan_for

    u, k = torch.empty(16, 256, 8192, device="meta"), torch.empty(256, 8192, device="meta")
    plan = plan_for(8192)
    routed = {"backend": "cuda-fp32", "kernel": "fused fp32 radix FFT conv, N=16384", "flops": 1,
              "reason": mf.backends.fp32_kernel_is_faster("bf16", True)}
    monkeypatch.setattr(mf, "explain", lambda u, k, precision=None: dict(routed))
    info = bench.methods._describe_tensor_core("bf16")(u, k)
    tensor_cores = mf.backends.tensor_core_backend(plan, "bf16", torch.float32, 16 * 256)
    assert info["backend"] == "tc-op" and info["kernel"] == tensor_cores.kernel
    monkeypatch.delenv(mf.backends.TC_KERNEL_ENV, raising=False)  # 16·256 sequences: the binding's engine
    assert "the tensor-core engine" in bench.methods._describe_tensor_core("bf16")(u, k)["kernel"]
    assert info["flops"] == tensor_cores.flops(plan, 16, 256) != routed["flops"]

    covered = {"backend": "cuda-tensor-core", "kernel": "k", "flops": 7, "reason": "the fused tensor-core kernel"}
    monkeypatch.setattr(mf, "explain", lambda u, k, precision=None: dict(covered))
    info = bench.methods._describe_tensor_core("bf16")(u, k)
    assert (info["backend"], info["kernel"], info["flops"]) == ("tc-op", "k", 7)


@pytest.mark.parametrize("script, options", [("kernel_times.py", ("--shape", "--flush-l2")),
                                             ("host_overhead.py", ("--shape", "--profile")),
                                             ("generation_profile.py", ("--shape", "--direct-step", "--host")),
                                             ("bitwise_outputs.py", ("--save", "--compare"))])
def test_gpu_timing_scripts_parse_their_options_on_the_cpu(script, options):
    """The GPU-only scripts (run on the device machine) import and parse their options here, so a
    broken one is caught before a device call is spent on it."""
    proc = subprocess.run([sys.executable, os.path.join(_BENCHMARKS, script), "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert all(option in proc.stdout for option in options), proc.stdout
    if script == "kernel_times.py":
        assert "--fwd-uniform-pairs-ab" in proc.stdout and "--groups" in proc.stdout
        proc = subprocess.run([sys.executable, os.path.join(_BENCHMARKS, script), "--shape", "2x6x64", "--groups", "4"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and "must be a divisor of C = 6" in proc.stderr, proc.stderr[-2000:]


def test_kernel_times_env_ab_cuts_the_profile_into_calls_by_launch_count():
    """kernel_times.py --env-ab: settings that launch other kernels, or fewer (a switch picks
    another instance, or drops a pass), are told apart by each setting's launch count: a
    kernel's times go to the setting whose call launched them, a call's launches of one kernel
    summed; a profile of the wrong length is refused."""
    spec = importlib.util.spec_from_file_location("kernel_times", os.path.join(_BENCHMARKS, "kernel_times.py"))
    kernel_times = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernel_times)
    rng = random.Random(7)
    # setting 0 launches a pass that setting 1 drops, and each its own instance of the middle kernel
    calls = [["outer", "grad_batch", "outer", "batch_sum"], ["outer", "grad_channel", "outer"]]
    events, want = [], [collections.defaultdict(list), collections.defaultdict(list)]
    for _ in range(5):
        for i, names in enumerate(calls):
            times = [rng.uniform(1, 100) for _ in names]
            events += list(zip(names, times))
            for name in set(names):
                want[i][name].append(sum(t for n, t in zip(names, times) if n == name))
    per_setting, counts = kernel_times.split_calls(events, [4, 3], 5)
    assert [dict(d) for d in per_setting] == [dict(d) for d in want]
    assert counts[0] == {"outer": 2, "grad_batch": 1, "batch_sum": 1} and counts[1] == {"outer": 2, "grad_channel": 1}
    with pytest.raises(SystemExit, match="35 launches profiled"):
        kernel_times.split_calls(events, [4, 4], 5)
    # the events both paths read: the device's, in launch order, the L2 flush's fill left out with --flush-l2
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    profile = SimpleNamespace(events=lambda: [
        SimpleNamespace(name=name, device_time=t, device_type=kind, time_range=SimpleNamespace(start=start))
        for name, t, kind, start in [("grad", 3.0, cuda, 30), ("vectorized_fill", 9.0, cuda, 5),
                                     ("aten::mm", 1.0, cpu, 1), ("outer", 2.0, cuda, 10)]])
    assert kernel_times.device_events(profile, True) == [("outer", 2.0), ("grad", 3.0)]
    assert kernel_times.device_events(profile, False) == [("vectorized_fill", 9.0), ("outer", 2.0), ("grad", 3.0)]


def test_kernel_times_forward_ab_picks_the_two_forward_kernels(capsys):
    """kernel_times.py --fwd-uniform-pairs-ab: the forward kernels' medians by name, thread 0's own
    path (gated or not) against the uniform pair sweep, the spectrum kernel left out."""
    spec = importlib.util.spec_from_file_location("kernel_times", os.path.join(_BENCHMARKS, "kernel_times.py"))
    kernel_times = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernel_times)
    ns = "void monarch_fftconv::(anonymous namespace)::fp32_detail::"
    kernel_times.forward_ab({
        ns + "fftconv_fp32_gated_kernel<12, float>(monarch_fftconv::GatedKArgs)": [200.0, 210.0, 190.0],
        ns + "fftconv_fp32_gated_uniform_pairs_kernel<12, float>(monarch_fftconv::GatedKArgs)": [180.0, 190.0, 170.0],
        ns + "filter_spectrum_kernel<12>(monarch_fftconv::SpectrumArgs)": [5.0, 5.0, 5.0],
    })
    out = capsys.readouterr().out
    assert "own path     200.0 µs, uniform pairs     180.0 µs, uniform/own 0.900" in out
    kernel_times.forward_ab({ns + "fftconv_fp32_kernel<12, float, false>(monarch_fftconv::KArgs)": [1.0]})
    assert "did not run both ways" in capsys.readouterr().out


# ---------------------------------------------------------------- half-precision I/O (--io-dtype)

def _settings(bench, **overrides):
    """The run settings of a quick CPU run, without measuring anything."""
    fields = dict(device="cpu", reps=3, warmup=1, warmup_seconds=0.0, quick=True, backward=False,
                  copy_bw=1e10, energy=None, profile=False, flush_l2=False, seed=0, max_spread=0.25)
    return bench.runner.Settings(**{**fields, **overrides})


def test_io_dtype_option(bench):
    assert bench.cli.resolve_config(bench.cli.parse_args(["--device", "cpu"]))["io_dtype"] == "float32"
    cfg = bench.cli.resolve_config(bench.cli.parse_args(["--device", "cpu", "--io-dtype", "bfloat16"]))
    assert cfg["io_dtype"] == "bfloat16" and bench.cli.IO_DTYPES["bfloat16"] is torch.bfloat16
    with pytest.raises(SystemExit):
        bench.cli.parse_args(["--io-dtype", "float64"])


@pytest.mark.parametrize("io_dtype", [torch.bfloat16, torch.float16])
def test_half_io_inputs_are_the_float32_draw_cast_and_the_reference_uses_them(bench, io_dtype):
    """The same draw as a float32 run, cast; the float64 reference computed from the cast values
    (not the float32 ones), so a method's error is its own arithmetic's; the memory floor at the
    I/O dtype's element size."""
    shape = (2, 3, 64)
    single = bench.runner.prepare_shape(shape, _settings(bench, backward=True))
    half = bench.runner.prepare_shape(shape, _settings(bench, backward=True, io_dtype=io_dtype))
    for drawn, cast in zip(single.input_sets[0][:3], half.input_sets[0][:3]):
        assert cast.dtype == io_dtype and torch.equal(cast, drawn.to(io_dtype))
    u, k, g, _ = half.input_sets[0]
    u64, k64 = u.double().requires_grad_(), k.double().requires_grad_()
    y64 = bench.methods.reference_conv(u64, k64)
    grad_u, grad_k = torch.autograd.grad(y64, (u64, k64), g.double())
    assert list(half.refs) == ["y", "u", "k"]
    assert torch.equal(half.refs["y"], y64.detach()) and torch.equal(half.refs["u"], grad_u)
    assert torch.equal(half.refs["k"], grad_k)
    assert not torch.equal(half.refs["y"], single.refs["y"])   # the input rounding is in the reference
    assert half.min_bytes == bench.guard.min_bytes(*shape, backward=True, elem=2) == single.min_bytes // 2
    assert half.common["io_dtype"] == str(io_dtype).removeprefix("torch.")


def test_half_io_budget_adds_the_rounding_of_y(bench):
    """y stored in bfloat16 is off by its rounding (~2^-9 relative): within fp32's budget plus
    2^-8, not within fp32's alone."""
    from monarch_fftconv.policy import ERROR_BUDGETS
    rel_err = 2.0 ** -9
    assert not bench.guard.error_budget_fields("monarch", "fp32", rel_err)["within_error_budget"]
    fields = bench.guard.error_budget_fields("monarch", "fp32", rel_err, torch.bfloat16)
    assert fields == {"error_budget": ERROR_BUDGETS["fp32"] + 2.0 ** -8, "within_error_budget": True}
    fp16 = bench.guard.error_budget_fields("monarch", "fp32", rel_err, torch.float16)
    assert fp16["error_budget"] == ERROR_BUDGETS["fp32"] + 2.0 ** -11 and not fp16["within_error_budget"]


@pytest.mark.parametrize("io_dtype", ["bfloat16", "float16"])
def test_quick_cpu_run_with_half_io(bench, tmp_path, monkeypatch, capsys, io_dtype):
    """monarch[p] gets the half-precision tensors as they are; the torch.fft methods compute
    in float32 between casts and say so; every row is within allclose and its budget (which
    includes y's rounding); the JSON and the printed table name the I/O dtype."""
    seen = []
    real_fftconv = bench.methods.mf.fftconv

    def spy(u, k, **kwargs):
        seen.append((u.dtype, k.dtype))
        return real_fftconv(u, k, **kwargs)
    monkeypatch.setattr(bench.methods.mf, "fftconv", spy)
    methods = f"reference,{_tuned('cpu')},monarch[fp32],monarch[bf16]"
    res = bench.cli.main(["--quick", "--device", "cpu", "--no-plots", "--backward", "--io-dtype", io_dtype,
                          "--methods", methods, "--out", str(tmp_path)])
    dtype = bench.cli.IO_DTYPES[io_dtype]
    assert seen and set(seen) == {(dtype, dtype)}
    out = capsys.readouterr().out
    assert f"(BxCxL, {io_dtype})" in out and f"I/O dtype {io_dtype}" in out
    meta = json.loads((tmp_path / "results.json").read_text())
    assert meta["io_dtype"] == io_dtype and meta["io_rounding"]["added_to_error_budgets"] > 0
    for r in res["rows"]:
        assert r["status"] == "ok" and r["io_dtype"] == io_dtype, r.get("error")
        assert bench.guard.is_accurate(r) and r["rel_err"] < 2.0 ** -8
        torch_fft = r["family"] != "monarch"
        assert ("cast to float32" in (r["reason"] or "")) == torch_fft, r["method"]
        if not torch_fft:
            assert r["within_error_budget"] and r["error_budget"] > 2.0 ** -11


def test_float32_run_keeps_its_rows_as_before(bench, tmp_path):
    res = bench.cli.main(["--quick", "--device", "cpu", "--no-plots", "--methods", f"reference,{_tuned('cpu')}",
                          "--out", str(tmp_path)])
    for r in res["rows"]:
        assert r["io_dtype"] == "float32" and r["reason"] is None
        assert r["min_bytes"] == bench.guard.min_bytes(r["B"], r["C"], r["L"], backward=False)


# ---------------------------------------------------------------- the cudnn peer (issue #32)

def cudnn_test_double(version=92600, refuse=None):
    """A TEST DOUBLE of cuDNN's frontend module `cudnn`, never the real one: backend_version()
    returns `version`, and ops.fft_causal_conv1d(x, weight) computes the causal convolution
    y[t] = Σ_j weight[j]·x[t−j] with torch.fft on the CPU (raising `refuse` instead, if given),
    so the benchmark's plumbing of the peer is tested without cuDNN."""
    def fft_causal_conv1d(x, weight):
        if refuse is not None:
            raise refuse
        assert x.dtype == weight.dtype and x.shape[-2] == weight.shape[0]
        n = 2 * x.shape[-1]
        y = torch.fft.irfft(torch.fft.rfft(x, n=n) * torch.fft.rfft(weight, n=n), n=n)
        return y[..., :x.shape[-1]]
    module = type(sys)("cudnn")
    module.backend_version = lambda: version
    module.ops = SimpleNamespace(fft_causal_conv1d=fft_causal_conv1d)
    return module


@pytest.fixture
def cudnn_on_cpu(bench, monkeypatch):
    """Lets the cudnn method run on the CPU; returns a function that installs a module as
    `cudnn` (None: as if not installed)."""
    monkeypatch.setattr(bench.methods, "CUDNN_DEVICES", ("cuda", "cpu"))
    monkeypatch.delenv(bench.methods.CUDNN_KIT_ENV, raising=False)   # no C API route unless a test sets one

    def install(module):
        monkeypatch.setitem(sys.modules, "cudnn", module)
    return install


def _skip_lines(stdout, method):
    """The lines saying that `method` (with others, or at one shape) was skipped."""
    return [line for line in stdout.splitlines()
            if line.startswith((f"{method}: skipped", f"{method}, ")) and ": skipped" in line]


@pytest.mark.parametrize("module, why", [
    (None, ["cudnn", "pip install nvidia-cudnn-cu13 nvidia-cudnn-frontend"]),
    (cudnn_test_double(version=92500), ["cuDNN 9.25.0 is older than 9.26.0"]),
    (SimpleNamespace(backend_version=lambda: 92600, ops=SimpleNamespace()), ["no cudnn.ops.fft_causal_conv1d"]),
])
def test_cudnn_that_cannot_load_is_one_skip_line_and_a_json_entry(bench, cudnn_on_cpu, tmp_path, capsys,
                                                                  module, why):
    cudnn_on_cpu(module)
    res = bench.cli.main(["--quick", "--device", "cpu", "--no-plots", "--backward", "--methods",
                          "reference,cudnn,cudnn.backward", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    (line,) = _skip_lines(out, "cudnn")
    assert line.startswith("cudnn, cudnn.backward: skipped (") and all(w in line for w in why), line
    assert [r["method"] for r in res["rows"]] == ["reference"]
    meta = json.loads((tmp_path / "results.json").read_text())
    assert [s["method"] for s in meta["skipped"]] == ["cudnn", "cudnn.backward"]
    assert all(all(w in s["reason"] for w in why) for s in meta["skipped"])
    assert meta["n_errors"] == 0


def test_cudnn_on_a_cpu_run_is_skipped_and_the_run_goes_on(bench, tmp_path, capsys):
    """The default method set holds cudnn; on the CPU it is skipped, with the reason."""
    assert "cudnn" in [m.name for m in bench.methods.make_methods("cpu")]
    res = bench.cli.main(["--quick", "--device", "cpu", "--no-plots", "--out", str(tmp_path)])
    assert _skip_lines(capsys.readouterr().out, "cudnn") == [
        "cudnn: skipped (cuDNN runs on CUDA devices only, this run is on cpu)"]
    assert "cudnn" not in {r["method"] for r in res["rows"]}
    assert all(r["status"] == "ok" for r in res["rows"])


def test_cudnn_rows_are_measured_and_validated_like_any_other(bench, cudnn_on_cpu, tmp_path):
    """With the test double loaded, cudnn takes part by default, and its rows carry timings,
    errors against float64 (y and both grads), the first call left out, no error budget (not
    this package's)."""
    cudnn_on_cpu(cudnn_test_double())
    by = {m.name: m for m in bench.methods.make_methods("cpu", backward=True)}
    assert by["cudnn"].unavailable is None and by["cudnn.backward"].unavailable is None
    res = bench.cli.main(["--quick", "--device", "cpu", "--no-plots", "--backward", "--methods",
                          "reference,cudnn,cudnn.backward", "--out", str(tmp_path)])
    rows = {r["method"]: r for r in res["rows"]}
    for name in ("cudnn", "cudnn.backward"):
        r = rows[name]
        _check_row(r, backward=True)
        assert r["status"] == "ok" and r["family"] == "cudnn" and r["backend"] == "cuDNN"
        assert r["rel_err"] < 1e-5 and r["grad_u_rel_err"] < 1e-5 and r["grad_k_rel_err"] < 1e-5
        assert bench.guard.is_accurate(r) and r["error_budget"] is None
        assert r["first_call_s"] > 0 and "JIT" in r["first_call_excluded"]
    assert json.loads((tmp_path / "results.json").read_text())["skipped"] == []


def test_cudnn_that_refuses_a_shape_is_skipped_there(bench, cudnn_on_cpu, tmp_path, capsys):
    cudnn_on_cpu(cudnn_test_double(refuse=ValueError("kernel_size 256 not supported")))
    res = bench.cli.main(["--quick", "--device", "cpu", "--no-plots", "--methods", "reference,cudnn",
                          "--out", str(tmp_path)])
    assert [r["method"] for r in res["rows"]] == ["reference"] and res["rows"][0]["status"] == "ok"
    (line,) = _skip_lines(capsys.readouterr().out, "cudnn")
    assert "1x2x256" in line and "kernel_size 256 not supported" in line
    (skip,) = json.loads((tmp_path / "results.json").read_text())["skipped"]
    assert skip["method"] == "cudnn" and skip["shape"] == "1x2x256" and "ValueError" in skip["reason"]


def test_other_methods_that_fail_their_first_call_stay_error_rows(bench, tmp_path, monkeypatch):
    """Only a peer marked skip_rejected turns a refused call into a skip."""
    monkeypatch.setattr(bench.methods, "per_call_spectrum_operator", lambda u, k: 1 / 0)
    res = bench.cli.main(["--quick", "--device", "cpu", "--no-plots", "--backward", "--methods",
                          _tuned("cpu"), "--out", str(tmp_path)])
    assert res["rows"][0]["status"] == "error" and "ZeroDivisionError" in res["rows"][0]["error"]
    assert json.loads((tmp_path / "results.json").read_text())["skipped"] == []


# ---------------------------------------------------------------- operators (issue #30, --operator)

def test_operator_option_and_flashfftconv_preset(bench):
    assert bench.cli.resolve_config(bench.cli.parse_args(["--device", "cpu"]))["operator"] == "plain"
    cfg = bench.cli.resolve_config(bench.cli.parse_args(
        ["--device", "cpu", "--preset", "flashfftconv", "--operator", "gated", "--io-dtype", "float16"]))
    assert cfg["shapes"] == [(64, 768, 8192)] and cfg["operator"] == "gated"
    from monarch_fftconv.planner import plan_for
    assert plan_for(8192).fft_size == 16384   # FlashFFTConv's FFT size there
    with pytest.raises(SystemExit, match="C=8 is not a multiple of 16"):
        bench.cli.resolve_config(bench.cli.parse_args(["--device", "cpu", "--operator", "grouped",
                                                       "--shapes", "1x32x64,1x8x64"]))
    with pytest.raises(SystemExit):
        bench.cli.parse_args(["--operator", "gelu"])


def _direct_operator(u, k, D=None, pregate=None, postgate=None):
    """fftconv's definition summed term by term in float64 (tiny sizes only): channel c takes
    filter c // (C // G); a bidirectional filter adds Σ_s k[g, 1, s]·x[t+s]."""
    x = u if pregate is None else pregate * u
    C, L = x.shape[-2:]
    y = torch.zeros_like(x)
    for c in range(C):
        taps = k[c // (C // k.shape[0])]
        for t in range(L):
            for s in range(L):
                if k.dim() == 2:
                    y[..., c, t] += taps[s] * x[..., c, t - s] if s <= t else 0
                else:
                    y[..., c, t] += (taps[0, s] * x[..., c, t - s] if s <= t else 0) + (
                        taps[1, s] * x[..., c, t + s] if t + s < L else 0)
    if D is not None:
        y = y + D.unsqueeze(-1) * x
    return y if postgate is None else postgate * y


@pytest.mark.parametrize("name", ["plain", "gated", "grouped", "bidirectional"])
def test_every_operator_form_matches_its_definition(bench, name):
    """The float64 reference (guard.float64_operator) and the methods' torch.fft forms (the
    reference's, written as users write them, and the tuned spectrum form) against the
    definition summed term by term."""
    operator = bench.runner.OPERATORS[name]
    gen = torch.Generator().manual_seed(0)
    B, C, L = 2, 32, 12

    def randn(*size):
        return torch.randn(*size, generator=gen, dtype=torch.float64)
    u, k = randn(B, C, L), randn(*operator.filter_shape(C, L))
    terms = {t: randn(C) if t == "D" else randn(B, C, L) for t in operator.terms}
    want = _direct_operator(u, k, **terms)
    m = bench.methods
    got = {"float64_operator": bench.guard.float64_operator(u, k, **terms),
           "reference_operator": m.reference_operator(u, k, **terms),
           "spectrum_operator": m.spectrum_operator(u, m.filter_spectrum(k, 2 * L), **terms)}
    for form, y in got.items():
        torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12, msg=form)


def test_min_bytes_of_the_operators(bench):
    """Compulsory bytes, counted by hand for B=1, C=16, L=8 (128 elements of u)."""
    min_bytes = bench.guard.min_bytes
    op = bench.runner.OPERATORS
    # gated forward: u, pregate, postgate read, y written; k (16x8) and D (16) read
    assert min_bytes(1, 16, 8, backward=False, **op["gated"].traffic(16)) == 4 * (4 * 128 + 128 + 16)
    # gated backward: also grad_y read, grad_u and both gates' grads written; grad_k, grad_D
    assert min_bytes(1, 16, 8, backward=True, **op["gated"].traffic(16)) == 4 * (8 * 128 + 2 * (128 + 16))
    # grouped: one filter row of 8 for the 16 channels; bidirectional: 2 x 16 rows; fp16 I/O
    assert min_bytes(1, 16, 8, backward=False, **op["grouped"].traffic(16)) == 4 * (2 * 128 + 8)
    assert min_bytes(1, 16, 8, backward=False, elem=2, **op["bidirectional"].traffic(16)) == 2 * (2 * 128 + 256)
    assert op["plain"].traffic(16) == {"filter_rows": 16, "gates": 0, "skip": False}


@pytest.mark.parametrize("name, skipped", [
    ("gated", {"monarch-module", "cudnn"}), ("grouped", {"cudnn"}), ("bidirectional", {"cudnn"})])
def test_quick_cpu_run_of_each_operator(bench, tmp_path, monkeypatch, capsys, name, skipped):
    """Each method with a form of the operator computes it, checked against float64 with the
    grads of every differentiable input; monarch[p] hands fftconv the terms; the others are
    skipped, one line each."""
    calls = []
    real_fftconv = bench.methods.mf.fftconv

    def spy(u, k, **kwargs):
        calls.append((tuple(k.shape), set(kwargs)))
        return real_fftconv(u, k, **kwargs)
    monkeypatch.setattr(bench.methods.mf, "fftconv", spy)
    res = bench.cli.main(["--quick", "--device", "cpu", "--no-plots", "--backward", "--operator", name,
                          "--shapes", "2x32x128", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    operator = bench.runner.OPERATORS[name]
    assert calls and {shape for shape, _ in calls} == {operator.filter_shape(32, 128)}
    expected_kwargs = {"precision", *operator.terms} | ({"bidirectional"} if operator.bidirectional else set())
    assert {frozenset(kwargs) for _, kwargs in calls} == {frozenset(expected_kwargs)}
    measured = {r["method"] for r in res["rows"]}
    for method in skipped:
        (line,) = _skip_lines(out, method)
        assert f"no --operator {name} form" in line and method not in measured
    assert {"reference", _tuned("cpu"), "monarch[fp32]", "monarch[bf16]"} <= measured
    grads = ["u", "k", *operator.terms]
    for r in res["rows"]:
        assert r["status"] == "ok" and r["operator"] == name, r.get("error")
        assert bench.guard.grad_names(r) == grads and bench.guard.is_accurate(r), r["method"]
        assert r["rel_err"] < 1e-5 and all(r[f"grad_{g}_rel_err"] < 1e-5 for g in grads), r["method"]
        assert r["min_bytes"] == bench.guard.min_bytes(2, 32, 128, backward=True, **operator.traffic(32))
    assert f"operator={name}" in out
    meta = json.loads((tmp_path / "results.json").read_text())
    assert meta["operator"] == name and meta["operator_definition"] == operator.definition


def test_a_wrong_operator_or_gradient_is_caught(bench, tmp_path, monkeypatch):
    """A method that leaves out the postgate fails allclose on y; one whose pregate gets no
    gradient (0 ⊙ pregate in the graph) keeps y right and fails on grad_pregate alone."""
    real_fftconv = bench.methods.mf.fftconv

    def no_postgate(u, k, postgate=None, **kwargs):
        return real_fftconv(u, k, **kwargs)

    def pregate_without_gradient(u, k, pregate=None, **kwargs):
        return real_fftconv(u, k, pregate=pregate.detach() + 0 * pregate, **kwargs)
    argv = ["--quick", "--device", "cpu", "--no-plots", "--operator", "gated", "--methods",
            "monarch[fp32]", "--shapes", "1x16x64", "--out", str(tmp_path)]
    monkeypatch.setattr(bench.methods.mf, "fftconv", no_postgate)
    (row,) = bench.cli.main(argv)["rows"]
    assert row["status"] == "ok" and not row["allclose"] and not bench.guard.is_accurate(row)
    monkeypatch.setattr(bench.methods.mf, "fftconv", pregate_without_gradient)
    (row,) = bench.cli.main(argv + ["--backward"])["rows"]
    assert row["allclose"] and row["rel_err"] < 1e-5 and row["grad_u_allclose"]
    assert not row["grad_pregate_allclose"] and not bench.guard.is_accurate(row)


def test_unfused_gated_training_method_turns_the_switch_off(bench, tmp_path, monkeypatch):
    """monarch-unfused-gated-train (run only when --methods names it) times fftconv with
    backends.FUSED_GATED_TRAINING off for its calls only: with --backward on the CPU (the portable
    engine standing in for the fp32 kernel) its step keeps the ATen gates (no gated op runs),
    accurate with every gradient, while monarch[fp32] goes through the gated ops; the switch is
    on again after."""
    from monarch_fftconv import backends, ops

    monkeypatch.setenv(backends.BACKEND_ENV, "portable")
    monkeypatch.setattr(backends.Portable, "fuses_gates", True)
    calls = []
    real = ops.gated_fftconv_op
    monkeypatch.setattr(ops, "gated_fftconv_op", lambda *args: (calls.append(args), real(*args))[1])
    for method in gated_training_rows(bench, tmp_path, "monarch-unfused-gated-train", calls.clear):
        assert bool(calls) is (method == "monarch[fp32]"), method  # fused: the gated ops ran
        assert backends.FUSED_GATED_TRAINING is True


def gated_training_rows(bench, tmp_path, switched: str, before_each):
    """The on-request row `switched` (absent from the default methods) and monarch[fp32], each
    timed alone with --backward --operator gated on the CPU, accurate; yields each method's name
    after its run (`before_each` runs before it)."""
    assert switched not in {m.name for m in bench.methods.make_methods("cpu", operator=bench.runner.OPERATORS["gated"])}
    for method in (switched, "monarch[fp32]"):
        before_each()
        res = bench.cli.main(["--quick", "--device", "cpu", "--no-plots", "--backward", "--operator", "gated",
                              "--methods", method, "--shapes", "2x16x128", "--out", str(tmp_path / method)])
        (row,) = res["rows"]
        assert row["status"] == "ok" and bench.guard.is_accurate(row), row.get("error")
        yield method


def test_dpostgate_in_grad_method_hands_z_to_the_backward(bench, tmp_path, monkeypatch):
    """monarch-dpostgate-in-grad (run only when --methods names it) times the fused gated step with
    backends.DPOSTGATE_IN_GRAD_KERNEL on, read at its forward: with --backward on the CPU (the
    portable engine standing in for the fp32 kernels) its backward op is given z and returns
    dpostgate, accurate with every gradient, where monarch[fp32]'s is not given z; the switch is
    off again after."""
    from monarch_fftconv import backends, ops

    monkeypatch.setenv(backends.BACKEND_ENV, "portable")
    monkeypatch.setattr(backends.Portable, "fuses_gates", True)
    given_z = []
    real = ops.gated_fftconv_backward_op
    monkeypatch.setattr(ops, "gated_fftconv_backward_op", lambda *args: (given_z.append(args[8] is not None),
                                                                         real(*args))[1])
    for method in gated_training_rows(bench, tmp_path, "monarch-dpostgate-in-grad", given_z.clear):
        assert given_z and set(given_z) == {method == "monarch-dpostgate-in-grad"}, method
        assert backends.DPOSTGATE_IN_GRAD_KERNEL is False


def test_plain_operator_keeps_the_plain_methods(bench):
    """--operator plain times what the benchmark timed before: the reference is reference_conv,
    every method runs, and the torch.fft rows keep their flop counts."""
    plain = {m.name: m for m in bench.methods.make_methods("cpu")}
    assert plain["reference"].entry == "reference_conv" and plain["monarch-module"].unavailable is None
    assert plain["reference"].flops(1, 2, 256, False, {}) == bench.methods.torch_fft_flops(
        1, 2, 256, filter_fft=True, backward=False)
    gated = {m.name: m for m in bench.methods.make_methods("cpu", operator=bench.runner.OPERATORS["gated"])}
    assert gated["reference"].entry == "reference_operator"
    assert gated["reference"].flops(1, 2, 256, False, {}) is None   # torch_fft_flops counts plain only


def test_ab_builds_checks_the_switch_builds_both_and_alternates(tmp_path):
    """ab_builds.sh (here with a stub gpu_setup.sh whose build_extension records its environment):
    a misspelt DEFINES stops it before anything is built; otherwise the default and the variant
    are built (the variant with the defines, in its own directory), the variant's TESTS run first
    (a failure stops it before any timing), then the command runs default, variant, default,
    variant, each with its build's environment and its own log."""
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    (repo / "benchmarks" / "ab_builds.sh").write_text((Path(_BENCHMARKS) / "ab_builds.sh").read_text())
    (repo / "benchmarks" / "gpu_setup.sh").write_text(
        'cd "$(dirname "${BASH_SOURCE[0]}")/.."\nOUT=${OUT:-$PWD/gpu_out}\nmkdir -p "$OUT"\n'
        'export MONARCH_FFTCONV_BUILD_DIR=${MONARCH_FFTCONV_BUILD_DIR:-/tmp/ab_stub_build}\n'
        'build_extension() { echo "defines=${MONARCH_FFTCONV_NVCC_DEFINES:-} dir=$MONARCH_FFTCONV_BUILD_DIR jobs=$MAX_JOBS" > "$1"; }\n')
    (repo / "monarch_fftconv").symlink_to(Path(_BENCHMARKS).parent / "monarch_fftconv")
    order, out = tmp_path / "order.txt", tmp_path / "out"
    command = ["bash", "-c", 'echo "defines=${MONARCH_FFTCONV_NVCC_DEFINES:-} dir=$MONARCH_FFTCONV_BUILD_DIR" >> "$ORDER"; '
               'echo timing-line']

    def ab(defines, **env):
        full = {k: v for k, v in os.environ.items() if not k.startswith("MONARCH_FFTCONV_")}
        full.update(OUT=str(out), ORDER=str(order), DEFINES=defines, MAX_JOBS="6", **env)
        return subprocess.run(["bash", str(repo / "benchmarks" / "ab_builds.sh"), *command], env=full,
                              capture_output=True, text=True, timeout=120)

    misspelt = ab("MONARCH_FFTCONV_FWD_PREFETCH_POINTT=2")
    assert misspelt.returncode == 2 and "MONARCH_FFTCONV_FWD_PREFETCH_POINTT" in misspelt.stdout + misspelt.stderr
    assert not out.exists() and not order.exists()

    (repo / "failing_test.py").write_text("def test_fails():\n    assert False\n")
    stopped = ab("MONARCH_FFTCONV_FWD_PREFETCH_POINT=2", TESTS=str(repo / "failing_test.py"))
    assert stopped.returncode == 1 and "nothing timed" in stopped.stdout and not order.exists()

    (repo / "passing_test.py").write_text("import os\n\ndef test_variant_env():\n"
                                          "    assert os.environ['MONARCH_FFTCONV_NVCC_DEFINES'] == 'MONARCH_FFTCONV_FWD_PREFETCH_POINT=2'\n")
    done = ab("MONARCH_FFTCONV_FWD_PREFETCH_POINT=2", TESTS=str(repo / "passing_test.py"))
    assert done.returncode == 0, done.stdout + done.stderr
    default, variant = "defines= dir=/tmp/ab_stub_build", "defines=MONARCH_FFTCONV_FWD_PREFETCH_POINT=2 dir=/tmp/ab_stub_build_variant"
    assert (out / "build.log").read_text().strip() == default + " jobs=3"
    assert (out / "build_variant.log").read_text().strip() == variant + " jobs=3"
    assert order.read_text().splitlines() == [default, variant, default, variant]
    for build in ("default", "variant"):
        for round_ in (1, 2):
            assert (out / f"ab_{build}_{round_}.log").read_text().strip() == "timing-line"
    assert done.stdout.count("timing-line") == 4 and "== variant, round 2 (status 0)" in done.stdout

    # Several variants (';'): each built in its own directory at once, each tested; one whose
    # tests fail is left out of the timing, the others alternate with the default.
    order.unlink()
    first, second = "MONARCH_FFTCONV_FWD_PREFETCH_POINT=1", "MONARCH_FFTCONV_FWD_DIRECT_SKIP=0"
    (repo / "picky_test.py").write_text("import os\n\ndef test_not_the_first():\n"
                                        f"    assert os.environ['MONARCH_FFTCONV_NVCC_DEFINES'] != '{first}'\n")
    several = ab(f"{first};{second};{first},{second}", TESTS=str(repo / "picky_test.py"), ROUNDS="1")
    assert several.returncode == 0, several.stdout + several.stderr
    builds = {name: f"defines={defines} dir=/tmp/ab_stub_build_{name}"
              for name, defines in (("variant1", first), ("variant2", second), ("variant3", f"{first},{second}"))}
    for name, line in builds.items():
        assert (out / f"build_{name}.log").read_text().strip() == line + " jobs=1"
    assert "variant1's tests failed" in several.stdout
    assert order.read_text().splitlines() == [default, builds["variant2"], builds["variant3"]]
    assert several.stdout.count("timing-line") == 3 and "== variant3, round 1 (status 0)" in several.stdout
    empty = ab(f"{first};;{second}")  # an empty variant would rebuild the default under another name
    assert empty.returncode == 2 and "an empty variant" in empty.stdout


@pytest.mark.parametrize("rows", ["all", "short"])
def test_ab_rows_are_valid_bench_calls(bench, tmp_path, rows):
    """benchmarks/ab_rows.sh (the rows an A/B of the pending switches times), run with a stub
    python3 that records its arguments: every row it issues is a bench_cufft.py call its parser
    takes, naming methods the bench has for that operator and pass (a misspelt method would
    stop the device run's row with an error and time nothing); the short form issues fewer rows,
    the gated step among them."""
    stub_dir, calls = tmp_path / "bin", tmp_path / "calls.jsonl"
    stub_dir.mkdir()
    (stub_dir / "python3").write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"open({str(calls)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\nprint('monarch[stub] row')\n")
    (stub_dir / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{stub_dir}{os.pathsep}{os.environ['PATH']}", "ROWS": rows}
    run = subprocess.run(["bash", os.path.join(_BENCHMARKS, "ab_rows.sh")], env=env, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    argvs = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(argvs) == (3 if rows == "short" else 6) and run.stdout.count("monarch[stub] row") == len(argvs)
    for argv in argvs:
        assert argv[0] == "benchmarks/bench_cufft.py"
        args = bench.cli.parse_args(argv[1:])
        names = args.methods.split(",")
        known = bench.methods.make_methods("cuda", backward=args.backward, only=names,
                                           operator=bench.runner.OPERATORS[args.operator])
        assert [m.name for m in known] == names
    assert any("monarch-dpostgate-in-grad" in argv[-1] and "--backward" in argv for argv in argvs)
