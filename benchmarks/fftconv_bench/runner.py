"""One benchmark run: for each shape, random inputs and their float64 reference, then every
method measured into one row (a failing method is an error row, not a crash; one that cannot run
here, or whose library rejects the shape, is skipped: a line and an entry of the JSON's
`skipped`); then the files."""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time
import traceback
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from fftconv_bench import guard
from fftconv_bench.cli import IO_DTYPES, method_names
from fftconv_bench.methods import Method, dtype_name, fft_library, make_methods, mf
from fftconv_bench.operators import OPERATORS, PLAIN, Operator
from fftconv_bench.outputs import CPU_NOTE, RowLog, environment, plot, write_outputs
from fftconv_bench.probes import EnergyMeter, count_kernel_launches, peak_extra_memory
from fftconv_bench.report import Progress, RULE, format_table, header_lines, skip_lines
from fftconv_bench.timing import (SETTLE_TOLERANCE, WARMUP_MAX_SECONDS, WARMUP_WINDOW,
                                  OtherLoad, buffer_plan, cache_bytes, copy_bandwidth, flush_bytes,
                                  milliseconds, relative_gap, spread, summarize, synchronize,
                                  time_back_to_back, time_per_call_latency, warm_up)

Tensor = torch.Tensor


class InputSet(NamedTuple):
    """One set of a method's inputs, all in the I/O dtype."""
    u: Tensor
    k: Tensor                         # the operator's filter shape
    grad_y: Optional[Tensor]          # with --backward
    terms: Dict[str, Tensor]          # the operator's other inputs (gated: D, pregate, postgate)


class MethodSkipped(Exception):
    """The method's library refused the shape's first call: a skip, not an error row."""


@dataclasses.dataclass
class Settings:
    """What every shape of the run shares."""
    device: str
    reps: int
    warmup: int                       # calls, at least
    warmup_seconds: float             # per method, at least
    quick: bool
    backward: bool
    copy_bw: float                    # bytes/s, measured
    energy: Optional[EnergyMeter]
    profile: bool                     # count kernel launches
    flush_l2: bool
    seed: int
    max_spread: float                 # IQR / median above which a row is NOISY
    io_dtype: torch.dtype = torch.float32   # of every tensor the methods take and return
    operator: Operator = PLAIN              # what is computed

    @property
    def pass_name(self) -> str:
        return "fwd+bwd" if self.backward else "fwd"


@dataclasses.dataclass
class ShapeInputs:
    """One shape's input buffer sets, their float64 reference and the fields its rows share."""
    input_sets: List[InputSet]
    refs: guard.Outputs64
    flush: Optional[Tensor]           # written between reps when rotation can't evict the inputs
    floor_s: Optional[float]          # memory floor
    min_bytes: int
    common: Dict[str, Any]


def _random_input_sets(shape: Tuple[int, int, int], n_sets: int,
                       settings: Settings) -> List[InputSet]:
    B, C, L = shape
    device, operator = settings.device, settings.operator
    # Generated on the device (a 64x768x8192 tensor takes seconds on the host).
    gen = torch.Generator(device=device).manual_seed(settings.seed + 1000003 * L + 1009 * C + B)

    def randn(*size: int) -> Tensor:
        return torch.randn(*size, generator=gen, device=device)
    sets = []
    for _ in range(n_sets):
        # u ~ N(0,1); k ~ N(0,1)/sqrt(L) so y = O(1), making atol=1e-2 meaningful.
        u = randn(B, C, L)
        k = randn(*operator.filter_shape(C, L)) / math.sqrt(L)
        g = randn(B, C, L) if settings.backward else None
        # gated: D (C,) and the gates (u's shape), all ~ N(0,1)
        terms = {name: randn(C) if name == "D" else randn(B, C, L) for name in operator.terms}
        # Cast after drawing: every I/O dtype sees the same values, up to its rounding.
        sets.append(InputSet(u.to(settings.io_dtype), k.to(settings.io_dtype),
                             None if g is None else g.to(settings.io_dtype),
                             {name: t.to(settings.io_dtype) for name, t in terms.items()}))
    return sets


def prepare_shape(shape: Tuple[int, int, int], settings: Settings) -> ShapeInputs:
    B, C, L = shape
    device = settings.device
    elem, traffic = settings.io_dtype.itemsize, settings.operator.traffic(C)
    nbytes = guard.min_bytes(B, C, L, backward=settings.backward, elem=elem, **traffic)
    floor_s = nbytes / settings.copy_bw if settings.copy_bw > 0 else None
    # one input set: u, the gates and grad_y; the filters and D
    set_bytes = elem * (B * C * L * (1 + traffic["gates"] + settings.backward)
                        + L * traffic["filter_rows"] + C * traffic["skip"])
    n_sets, need_flush = buffer_plan(set_bytes, cache_bytes(device))
    flush = None
    if settings.flush_l2 or (need_flush and not settings.quick):
        flush = torch.empty(flush_bytes(device) // 4, dtype=torch.float32, device=device)
    input_sets = _random_input_sets(shape, n_sets, settings)
    # True only when neither rotation nor a flush keeps the inputs out of the cache (--quick).
    resident = flush is None and n_sets * set_bytes < 2 * cache_bytes(device)
    common = {"B": B, "C": C, "L": L, "shape": f"{B}x{C}x{L}", "pass": settings.pass_name,
              "io_dtype": dtype_name(settings.io_dtype), "operator": settings.operator.name,
              "device": device, "reps": settings.reps, "warmup": settings.warmup,
              "n_buffers": n_sets, "l2_flush": flush is not None,
              "cache_resident_inputs": resident, "min_bytes": nbytes,
              "floor_ms": floor_s * 1e3 if floor_s else None}
    first = input_sets[0]
    refs = guard.float64_reference(first.u, first.k, first.grad_y, **first.terms)
    return ShapeInputs(input_sets, refs, flush, floor_s, nbytes, common)


def _describe_into(row: Dict[str, Any], m: Method, inputs: InputSet) -> Dict[str, Any]:
    info = m.describe(inputs.u, inputs.k, **inputs.terms) or {}
    row.update(backend=info.get("backend"), kernel=info.get("kernel"),
               precision=info.get("precision", m.precision), reason=info.get("reason"),
               fft_size=info.get("fft_size"), factors=info.get("factors"))
    if info.get("explain_error"):
        row["explain_error"] = info["explain_error"]
    return info


def _time_into(row: Dict[str, Any], calls: Sequence[Callable[[], Any]], inputs: ShapeInputs,
               settings: Settings) -> float:
    """Warms the calls up until their times settle, then times them back to back and one at a
    time; fills the warm-up and timing fields (back-to-back: median_ms..., per-call latency:
    latency_median_ms...), the noise fields (_noise_into), validity (INVALID if either median
    is under the floor, else NOISY if the timing is noise) and GB/s (back-to-back); returns
    the back-to-back median (s)."""
    other_load = OtherLoad() if settings.device != "cuda" else None
    warmed = warm_up(calls, settings.warmup, settings.device, min_seconds=settings.warmup_seconds,
                     flush=inputs.flush)
    row.update(warmup_calls=warmed["calls"], warmup_s=warmed["seconds"],
               warmup_settled=warmed["settled"])
    clock = dict(reps=settings.reps, device=settings.device, flush=inputs.flush)
    back_to_back = summarize(time_back_to_back(calls, **clock))
    latency = summarize(time_per_call_latency(calls, **clock))
    row.update(milliseconds(back_to_back))
    row.update(milliseconds(latency, prefix="latency_"))
    median_s = back_to_back["median_s"]
    noise = _noise_into(row, back_to_back, latency, other_load, settings)
    row["validity"] = guard.worst_validity(guard.validate_time(median_s, inputs.floor_s),
                                           guard.validate_time(latency["median_s"], inputs.floor_s),
                                           *noise)
    row["gbps"] = inputs.min_bytes / median_s / 1e9
    return median_s


def _noise_into(row: Dict[str, Any], back_to_back: Dict[str, float], latency: Dict[str, float],
                other_load: Optional[OtherLoad], settings: Settings) -> List[str]:
    """Fills spread (IQR / median, the worse clock's; on the host also the gap between the
    clocks' medians, which time the same loop there), other_cores (host: the cores other
    processes kept busy since the warm-up began) and noisy_because; returns the verdicts."""
    row["spread"] = max(spread(back_to_back), spread(latency))
    if settings.device != "cuda":
        row["spread"] = max(row["spread"], relative_gap(back_to_back["median_s"], latency["median_s"]))
    verdicts = {f"spread {row['spread']:.2f}": guard.validate_spread(row["spread"], settings.max_spread)}
    row["other_cores"] = other_load.other_cores() if other_load else None
    if row["other_cores"] is not None:
        threads, cores = torch.get_num_threads(), len(os.sched_getaffinity(0))
        why = f"other processes kept {row['other_cores']:.1f} of {cores} cores busy, {threads} threads here"
        verdicts[why] = guard.validate_other_load(row["other_cores"], threads, cores)
    row["noisy_because"] = "; ".join(why for why, v in verdicts.items() if v == "NOISY") or None
    return list(verdicts.values())


def _probe_into(row: Dict[str, Any], calls: Sequence[Callable[[], Any]], median_s: float,
                settings: Settings) -> None:
    """Peak memory, kernel launches and energy of the method (GPU only)."""
    peak = peak_extra_memory(calls[0], settings.device)
    row["peak_extra_mb"] = None if peak is None else peak / 2**20
    if settings.profile:
        try:
            launches = count_kernel_launches(calls[0], settings.device)
        except Exception as e:  # noqa: BLE001
            launches, row["profile_error"] = None, f"{type(e).__name__}: {e}"
        if launches is not None:
            row["kernel_launches"] = launches["kernels"]
            row["memops"] = launches["memops"]
    if settings.energy is not None and settings.energy.available:
        row["energy_mj"] = settings.energy.per_call_mj(calls, median_s)


def _first_call(row: Dict[str, Any], m: Method, call: Callable[[], Any], device: str) -> Any:
    """The first call, whose outputs are validated, outside every timing. Where it does more
    than later calls (m.first_call: compilation), its time is recorded and the row says it was
    left out; where the method's library refuses it (m.skip_rejected), MethodSkipped."""
    start = time.perf_counter()
    try:
        outputs = call()
        synchronize(device)
    except Exception as e:  # noqa: BLE001
        if m.skip_rejected:
            raise MethodSkipped(f"{type(e).__name__}: {e}".strip()[:300]) from e
        raise
    if m.first_call:
        row.update(first_call_s=time.perf_counter() - start, first_call_excluded=m.first_call)
    return outputs


def measure_method(m: Method, inputs: ShapeInputs, settings: Settings) -> Dict[str, Any]:
    """One row: description, error vs float64, timings, floor check, flops, probes. Raises
    MethodSkipped where the method's library refuses the shape."""
    row = dict(inputs.common, method=m.name, family=m.family, entry=m.entry,
               train_step=m.train_step, requested_precision=m.precision, status="ok", error=None)
    try:
        _describe_into(row, m, inputs.input_sets[0])
        calls = [m.build(s.u, s.k, s.grad_y, **s.terms) for s in inputs.input_sets]
        row.update(guard.outputs_error(_first_call(row, m, calls[0], settings.device), inputs.refs))
        info = _describe_into(row, m, inputs.input_sets[0])   # again: a lazy kernel build may have run
        row.update(guard.error_budget_fields(m.family, row.get("precision"), row.get("rel_err"),
                                             settings.io_dtype))
        median_s = _time_into(row, calls, inputs, settings)
        row["flops"] = m.flops(row["B"], row["C"], row["L"], settings.backward, info)
        row["tflops"] = row["flops"] / median_s / 1e12 if row["flops"] else None
        _probe_into(row, calls, median_s, settings)
        del calls
    except MethodSkipped:
        raise
    except Exception as e:  # noqa: BLE001 -- a failing method is a row, not a crash
        row["status"] = "error"
        row["error"] = f"{type(e).__name__}: {e}".strip()[:500]
        row["traceback"] = traceback.format_exc(limit=4)[-2000:]
        if settings.device == "cuda":
            torch.cuda.empty_cache()
    return row


def run_shape(shape: Tuple[int, int, int], methods: Sequence[Method], settings: Settings,
              progress: Progress, log: RowLog,
              skipped: Optional[List[Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """Every method on one shape; each row logged as soon as it is done (the reference comes
    first, so a logged row already carries its speedup; the rows a row's computation is
    compared with come before it). A method whose library refuses the shape is printed and
    appended to `skipped` instead."""
    inputs = prepare_shape(shape, settings)
    rows: List[Dict[str, Any]] = []
    for m in methods:
        progress.start(f"{inputs.common['shape']} {settings.pass_name} {m.name}")
        try:
            rows.append(measure_method(m, inputs, settings))
        except MethodSkipped as refused:
            skip = {"method": m.name, "shape": inputs.common["shape"],
                    "reason": f"its library refused the call: {refused}"}
            if skipped is not None:
                skipped.append(skip)
            progress.skip(f"{m.name}: skipped at {skip['shape']} ({skip['reason']})")
            continue
        guard.mark_same_computations(rows, settings.max_spread)  # may make rows NOISY: first
        guard.assign_speedups(rows)
        log.add(rows[-1])
        progress.finish(rows[-1])
    del inputs
    if settings.device == "cuda":
        torch.cuda.empty_cache()
    return rows


def _copy_bytes(device: str, quick: bool) -> int:
    # Large enough to stream from DRAM (a 60 MB L2 must not hold src + dst).
    if device == "cuda":
        return (256 << 20) if quick else (1 << 30)
    return (16 << 20) if quick else (256 << 20)


def _meta(args: argparse.Namespace, cfg: Dict[str, Any], env: Dict[str, Any], settings: Settings,
          copy_bytes: int, rows: Sequence[Dict[str, Any]],
          skipped: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    return {
        "benchmark": "bench_cufft", **env, "args": dict(vars(args)),
        "shapes": [list(shape) for shape in cfg["shapes"]], "reps": cfg["reps"],
        "warmup": cfg["warmup"], "warmup_seconds": cfg["warmup_seconds"],
        "max_spread": settings.max_spread, "pass": settings.pass_name,
        "copy_bandwidth_gbps": settings.copy_bw / 1e9, "copy_bytes": copy_bytes,
        "timing": {
            "warm_up": f"per method, at least `warmup` calls and `warmup_seconds`, then windows "
                       f"of {WARMUP_WINDOW} calls until two in a row have medians within "
                       f"{SETTLE_TOLERANCE:.0%} (warmup_settled), for at most "
                       f"{WARMUP_MAX_SECONDS:g} s; warmup_calls, warmup_s per row",
            "back_to_back": "median_ms, q1_ms, ...: reps calls enqueued back to back, one event "
                            "pair around each (throughput; host overhead overlapped)",
            "latency": "latency_median_ms, ...: one call at a time, device synchronized before "
                       "it, timed until its work is done (host overhead included)",
            "speedups": "speedup_vs_reference (back-to-back) and latency_speedup_vs_reference, "
                        "against the reference method with the same train_step; None where "
                        "either row is INVALID or NOISY",
            "noise": f"spread = IQR / median, the worse of the two clocks (on the host also "
                     f"the relative gap between their medians: they time the same loop there); "
                     f"above max_spread ({settings.max_spread:g}) the row is NOISY: untrusted, "
                     f"no speedup",
            "same_computation_as": "the earlier row of the shape that runs the same code (same "
                                   "entry point, train_step, backend and kernel): the two times "
                                   "differ by noise alone; the plots draw such rows once"},
        "operator": cfg["operator"],
        "operator_definition": settings.operator.definition,
        "train_steps": {"autograd.grad": "<method>: torch.autograd.grad(y, (u, k), g)"
                                         + ("" if not settings.operator.terms else
                                            ", and the grads of D, pregate and postgate"),
                        "backward+accumulate": "<method>.backward: y.backward(g), grads "
                                               "accumulated into .grad across reps"},
        "tolerance": {"atol": guard.ATOL, "rtol": guard.RTOL},
        "error_budgets": dict(guard.ERROR_BUDGETS),
        "io_dtype": cfg["io_dtype"],
        "io_rounding": {
            "added_to_error_budgets": guard.IO_ROUNDING[settings.io_dtype],
            "why": "y stored in a half-precision I/O dtype is rounded by up to half an ulp "
                   "(relative 2^-8 bfloat16, 2^-11 float16) on top of the arithmetic's error"},
        "energy_note": (settings.energy.note if settings.energy
                        else "energy not requested (--energy)"),
        "gbps_definition": "compulsory bytes (min_bytes: u + k read, y written; with --backward "
                           "also grad_y read, grad_u and grad_k written; each element the I/O "
                           "dtype's size) / median time",
        "flops_convention": (
            "torch.fft methods: 2.5*N*log2(N) per real FFT of N=2L points + 6 per complex multiply; "
            "monarch methods: explain()['flops'] (one forward call incl. the filter transform, "
            "so slightly high for the cached monarch-module; fwd+bwd only if explain gives "
            "'flops_backward')"),
        "inputs": f"u ~ N(0,1) (B,C,L) float32; k ~ N(0,1)/sqrt(L) "
                  f"{settings.operator.filter_dims} float32"
                  + ("" if not settings.operator.gated else
                     "; D ~ N(0,1) (C,), pregate and postgate ~ N(0,1) (B,C,L) float32")
                  + ("" if cfg["io_dtype"] == "float32" else
                     f"; all (and grad_y) cast to {cfg['io_dtype']}, the float64 reference "
                     f"computed from the cast values"),
        "n_invalid": sum(r.get("validity") == "INVALID" for r in rows),
        "n_noisy": sum(r.get("validity") == "NOISY" for r in rows),
        "n_errors": sum(r["status"] != "ok" for r in rows),
        "skipped": list(skipped)}


def _start(args: argparse.Namespace, cfg: Dict[str, Any],
           skipped: Sequence[Dict[str, Any]]) -> Tuple[Dict[str, Any], Settings, int]:
    """Environment, copy bandwidth and energy meter, with the header printed as they come (the
    methods skipped in this run among it, one line per reason)."""
    device = cfg["device"]
    env = environment(device)
    env["monarch_fftconv_version"] = getattr(mf, "__version__", None)
    env["fft_library"] = fft_library(device)   # what torch.fft runs here
    print("\n".join(header_lines(env, device)))
    if cfg["io_dtype"] != "float32":
        print(f"I/O dtype {cfg['io_dtype']}: every input (and grad_y) drawn in float32 and cast to it; the "
              f"float64 reference is computed from the cast values; torch.fft methods compute in "
              f"float32 between casts; error budgets include y's rounding to it")
    if cfg["operator"] != "plain":
        print(f"operator {cfg['operator']}: {OPERATORS[cfg['operator']].definition}")
    if device == "cuda" and cfg["reps"] < 30 and not args.quick:
        print(f"warning: --reps {cfg['reps']} < 30: medians/IQRs will be noisy")
    copy_bytes = _copy_bytes(device, args.quick)
    copy_bw = copy_bandwidth(device, copy_bytes)
    print(f"copy bandwidth (measured, {copy_bytes >> 20} MiB {device} copy, read+write): "
          f"{copy_bw / 1e9:.0f} GB/s; memory floor = compulsory bytes / that")
    print(f"warm-up per method: at least {cfg['warmup']} calls and {cfg['warmup_seconds']:g} s, "
          f"then until two windows of {WARMUP_WINDOW} calls agree to {SETTLE_TOLERANCE:.0%}")
    energy = EnergyMeter(device) if args.energy else None
    if energy is not None:
        print(energy.note)
    for line in skip_lines(skipped):
        print(line)
    print(RULE, flush=True)
    settings = Settings(device=device, reps=cfg["reps"], warmup=cfg["warmup"],
                        warmup_seconds=cfg["warmup_seconds"], quick=args.quick,
                        backward=args.backward, copy_bw=copy_bw, energy=energy,
                        profile=not args.no_profile, flush_l2=args.flush_l2, seed=args.seed,
                        max_spread=cfg["max_spread"], io_dtype=IO_DTYPES[cfg["io_dtype"]],
                        operator=OPERATORS[cfg["operator"]])
    return env, settings, copy_bytes


def _finish(args: argparse.Namespace, meta: Dict[str, Any],
            rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Write results.json / results.csv and the plots; print where they went."""
    paths = write_outputs(args.out, meta, rows)
    plots: List[str] = []
    if not args.no_plots:
        try:
            plots = plot(args.out, rows, meta)
        except Exception as e:  # noqa: BLE001
            print(f"warning: plotting failed: {type(e).__name__}: {e}")
    print(f"{len(rows)} rows ({meta['n_errors']} errors, {meta['n_invalid']} INVALID, "
          f"{meta['n_noisy']} NOISY) -> "
          f"{paths['json']}, {paths['csv']}" + (f", {len(plots)} plots" if plots else ""))
    if meta["device"] == "cpu":
        print("reminder: " + CPU_NOTE)
    return {"meta": meta, "rows": rows, "paths": paths, "plots": plots}


def run(args: argparse.Namespace, cfg: Dict[str, Any]) -> Dict[str, Any]:
    """The whole run for parsed args and their resolved config: {meta, rows, paths, plots}."""
    torch.manual_seed(args.seed)
    methods = make_methods(cfg["device"], compile=args.compile, backward=args.backward,
                           only=method_names(args.methods), operator=OPERATORS[cfg["operator"]])
    skipped = [{"method": m.name, "reason": m.unavailable} for m in methods if m.unavailable]
    methods = [m for m in methods if not m.unavailable]
    env, settings, copy_bytes = _start(args, cfg, skipped)
    log = RowLog(args.out)
    print(f"rows are written to {log.jsonl_path} and {log.csv_path} as they finish", flush=True)
    progress = Progress(len(cfg["shapes"]) * len(methods))
    rows: List[Dict[str, Any]] = []
    try:
        for shape in cfg["shapes"]:
            shape_rows = run_shape(shape, methods, settings, progress, log, skipped)
            rows.extend(shape_rows)
            progress.write("\n" + format_table(shape_rows, settings.max_spread) + "\n")
    except KeyboardInterrupt:
        print(f"\ninterrupted: the {len(log.rows)} finished rows are in {log.jsonl_path} and "
              f"{log.csv_path}", flush=True)
        raise
    finally:
        progress.close()
    return _finish(args, _meta(args, cfg, env, settings, copy_bytes, rows, skipped), rows)
