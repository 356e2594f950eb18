#!/usr/bin/env python
"""Benchmark monarch_fftconv against cuFFT (torch.fft): honest, complete, pictured.

    python benchmarks/bench_cufft.py                       # reference workload 16x256x8192, fp32 I/O
    python benchmarks/bench_cufft.py --backward            # forward+backward (grads w.r.t. u and k)
    python benchmarks/bench_cufft.py --preset lengths      # B=16, C=256, L = 1024 ... 16384
    python benchmarks/bench_cufft.py --shapes 16x256x8192,16x256x1024 --compile --energy
    python benchmarks/bench_cufft.py --quick --device cpu  # tiny CPU smoke run (used by the tests)

Methods, side by side in one run (all take float32 u (B,C,L) and k (C,L), return float32 y):
  reference          torch.fft exactly as commonly written: F.pad to 2L, rfft of u AND of k every
                     call, irfft, slice [..., :L].
  cufft-tuned        rfft(u, n=2L) with the filter spectrum rfft(k, n=2L) computed once outside
                     the timed call (forward). With --backward the filter spectrum must be
                     recomputed every call (it needs a gradient), so it is.
  compile-reference  torch.compile of `reference` (--compile); compile time is not timed.
  monarch[<p>]       monarch_fftconv.fftconv(u, k, precision=p) for p in fp32, tf32, bf16, fp16,
                     labelled with the backend monarch_fftconv.explain() reports.
  monarch-module     monarch_fftconv.FFTConv (package-default precision), which caches the filter
                     spectrum under no_grad: the like-for-like rival of cufft-tuned.

Timing (GPU): CUDA events around each rep (one event pair per rep), warm-up first, median and IQR
of --reps reps (default 50). Inputs rotate among enough buffer sets that their total exceeds twice
the L2 cache; if that would need too many buffers (tiny shapes), a 256 MB buffer is written between
reps instead, outside the timed region. Each rep times the whole call as a user makes it (Python
dispatch and launches included). On a CPU-only machine the host timer time.perf_counter is used
and the results say plainly that they are CPU figures.

Validity, measured in the same run: relative L2 error of every method against float64 torch.fft
on the same inputs, allclose(atol=1e-2, rtol=1e-2); the device copy bandwidth, and from it each
shape's memory floor; a time under the floor is printed INVALID and gets no speedup.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as _dt
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
PRESETS: Dict[str, List[Tuple[int, int, int]]] = {
    "seed": [(16, 256, 8192)],
    "lengths": [(16, 256, L) for L in (1024, 2048, 4096, 8192, 16384)],
    "hyena": [(64, 768, 8192)],
}
CPU_DEFAULT_SHAPES = [(2, 4, 2048)]
QUICK_SHAPES = [(1, 2, 256)]
GPU_DEFAULT_REPS = 50
CPU_DEFAULT_REPS = 10
QUICK_REPS = 3
ATOL = RTOL = 1e-2
FLUSH_BYTES = 256 * 2**20

# Issue #3's targets for the fused tensor-core kernel on the reference workload (forward, fp32
# I/O): precision -> (time target in ms or None, relative L2 error budget). Matmul ceilings
# measured on the H200 (TFLOP/s); fp16 runs at the bf16 rate.
TARGET_SHAPE = "16x256x8192"
TARGETS = {"bf16": (0.20, 1e-2), "tf32": (0.35, 1e-3), "fp16": (None, 2e-3)}
CEILING_TFLOPS = {"bf16": 771.0, "fp16": 771.0, "tf32": 397.0}
MAX_BUFFERS = 64

CPU_NOTE = ("CPU FIGURES, NOT GPU ONES: no CUDA device was used, so this run times the portable "
            "PyTorch path of monarch_fftconv against torch.fft on the host (time.perf_counter "
            "medians). These numbers say nothing about GPU performance.")


# ----------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------

def parse_shapes(spec: str) -> List[Tuple[int, int, int]]:
    """'16x256x8192,16x256x1024' -> [(16, 256, 8192), (16, 256, 1024)]. Raises ValueError."""
    shapes = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        parts = item.lower().split("x")
        try:
            dims = tuple(int(p) for p in parts)
        except ValueError:
            dims = ()
        if len(dims) != 3 or any(d <= 0 for d in dims):
            raise ValueError(
                f"bad shape {item!r}: expected BxCxL with three positive integers, "
                f"e.g. 16x256x8192")
        shapes.append(dims)
    if not shapes:
        raise ValueError(f"no shapes in {spec!r}: expected e.g. 16x256x8192,16x256x1024")
    return shapes


def _shapes_type(spec: str) -> List[Tuple[int, int, int]]:
    try:
        return parse_shapes(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench_cufft.py",
        description="Benchmark monarch_fftconv against cuFFT (torch.fft) causal convolution.",
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--shapes", type=_shapes_type, default=None,
                   help="comma-separated BxCxL list, e.g. 16x256x8192,16x256x1024")
    g.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="seed: 16x256x8192; lengths: B=16,C=256,L=1024..16384; hyena: 64x768x8192")
    p.add_argument("--backward", action="store_true",
                   help="time forward+backward (grads w.r.t. u and k) instead of forward only")
    p.add_argument("--compile", action="store_true", help="also time torch.compile(reference)")
    p.add_argument("--energy", action="store_true", help="measure energy per call with NVML")
    p.add_argument("--reps", type=int, default=None,
                   help=f"timed reps (default {GPU_DEFAULT_REPS} on GPU, {CPU_DEFAULT_REPS} on CPU)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls (default 10; quick 1)")
    p.add_argument("--flush-l2", action="store_true",
                   help="write a 256 MB buffer between reps (outside the timed region) "
                        "in addition to rotating input buffers")
    p.add_argument("--methods", default=None,
                   help="comma-separated subset of method names to run (default: all)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="auto: cuda if available, else cpu (default: auto)")
    p.add_argument("--quick", action="store_true", help="tiny size and few reps (for tests)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--no-profile", action="store_true", help="skip kernel-launch counting")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads for this run (default: unchanged; --quick: 1)")
    p.add_argument("--seed", type=int, default=0, help="input RNG seed (default: 0)")
    p.add_argument("--out", default="bench_out", help="output directory (default: bench_out)")
    args = p.parse_args(argv)
    if args.reps is not None and args.reps < 1:
        p.error("--reps must be >= 1")
    if args.warmup is not None and args.warmup < 0:
        p.error("--warmup must be >= 0")
    return args


def resolve_config(args: argparse.Namespace) -> Dict[str, Any]:
    """Turn parsed args into the concrete device / shapes / reps of this run."""
    if args.device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    else:
        device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda requested but torch.cuda.is_available() is False")
    if args.shapes is not None:
        shapes = args.shapes
    elif args.preset is not None:
        shapes = PRESETS[args.preset]
    elif args.quick:
        shapes = QUICK_SHAPES
    else:
        shapes = PRESETS["seed"] if device == "cuda" else CPU_DEFAULT_SHAPES
    if args.reps is not None:
        reps = args.reps
    elif args.quick:
        reps = QUICK_REPS
    else:
        reps = GPU_DEFAULT_REPS if device == "cuda" else CPU_DEFAULT_REPS
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 10)
    return {"device": device, "shapes": [tuple(s) for s in shapes], "reps": reps, "warmup": warmup,
            "quick": bool(args.quick)}


# ----------------------------------------------------------------------------------------------
# Methods
# ----------------------------------------------------------------------------------------------

def reference_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The reference, exactly as commonly written (filter FFT every call, explicit padding)."""
    L = u.shape[-1]
    x_f = torch.fft.rfft(F.pad(u, (0, L)))
    k_f = torch.fft.rfft(F.pad(k, (0, L)))   # benchmark uses Lk == L, so both have n = 2L
    return torch.fft.irfft(x_f * k_f, n=2 * L)[..., :L]


def _rfft_flops(n: int) -> float:
    # Convention: a complex FFT of n points costs 5·n·log2(n) flops; a real-input FFT (or a
    # Hermitian-output inverse) costs half of that, 2.5·n·log2(n). Padding/slicing are not flops.
    return 2.5 * n * math.log2(n) if n > 1 else 0.0


def cufft_flops(B: int, C: int, L: int, *, filter_fft: bool, backward: bool) -> float:
    """Nominal flops of the torch.fft convolution with FFT size N = 2L.

    forward:  per row (B·C rows): rfft(u) + irfft = 2 real FFTs, plus 6 flops per complex
              multiply over N/2+1 bins; per channel: rfft(k) when the filter spectrum is not
              cached (filter_fft=True).
    backward: per row: rfft(grad_y) + irfft for grad_u = 2 real FFTs, 2 complex multiplies per
              bin (grad_u and grad_k spectra); reduction of grad_k over the batch (2 flops per
              bin per extra batch entry); per channel: irfft for grad_k; with a per-call filter
              FFT, that's the one transform the backward of rfft(k) needs.
    """
    N = 2 * L
    bins = N // 2 + 1
    rows = B * C
    f = rows * (2 * _rfft_flops(N) + 6 * bins)
    if filter_fft:
        f += C * _rfft_flops(N)
    if backward:
        f += rows * (2 * _rfft_flops(N) + 2 * 6 * bins) + 2 * bins * (B - 1) * C
        f += C * _rfft_flops(N)
    return f


def min_bytes(B: int, C: int, L: int, *, backward: bool, elem: int = 4) -> int:
    """Compulsory DRAM traffic of one call: the memory floor's numerator.

    forward: u read + k read + y written. forward+backward: additionally grad_y read, grad_u and
    grad_k written (u and k counted once: an ideal fused implementation reads them once).
    """
    act, filt = B * C * L, C * L
    if backward:
        return elem * (4 * act + 2 * filt)
    return elem * (2 * act + filt)


@dataclasses.dataclass
class Method:
    name: str                       # unique short id (CLI --methods, JSON, CSV)
    family: str                     # reference | cufft | compile | monarch
    precision: Optional[str]        # requested precision (None: package default / n.a.)
    # build(u, k, grad_y or None) -> zero-arg callable performing one user call. Setup done in
    # build (e.g. caching the filter spectrum) is not timed. Forward callables return y; backward
    # ones return (y, grad_u, grad_k).
    build: Callable[..., Callable[[], Any]]
    describe: Callable[[torch.Tensor, torch.Tensor], Dict[str, Any]]
    flops: Callable[[int, int, int, bool, Dict[str, Any]], Optional[float]]
    setup_error: Optional[str] = None   # e.g. the package could not be imported


def _fwd_bwd(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
             u: torch.Tensor, k: torch.Tensor, g: Optional[torch.Tensor]) -> Callable[[], Any]:
    """Wrap y = fn(u, k) as a user call; with g, forward + backward for grads w.r.t. u and k."""
    if g is None:
        return lambda: fn(u, k)
    u_r = u.detach().requires_grad_(True)   # shares storage with the buffer: no extra copy
    k_r = k.detach().requires_grad_(True)

    def call():
        y = fn(u_r, k_r)
        gu, gk = torch.autograd.grad(y, (u_r, k_r), g)
        return y, gu, gk
    return call


def _import_monarch():
    """Import the real package; fall back to the repository root if it's not installed."""
    try:
        import monarch_fftconv as mf  # noqa: F401
        if not hasattr(mf, "fftconv"):
            raise ImportError("monarch_fftconv has no attribute 'fftconv' (empty namespace package?)")
        return mf, None
    except Exception as first:  # noqa: BLE001
        if _REPO not in sys.path:
            sys.path.insert(0, _REPO)
            sys.modules.pop("monarch_fftconv", None)
            try:
                import monarch_fftconv as mf  # noqa: F811
                if hasattr(mf, "fftconv"):
                    return mf, None
            except Exception:  # noqa: BLE001
                pass
        return None, f"cannot import monarch_fftconv: {type(first).__name__}: {first}"


def make_methods(*, compile: bool = False, mf: Any = None, mf_error: Optional[str] = None,
                 only: Optional[Sequence[str]] = None) -> List[Method]:
    """All methods of the run, in table order. `mf` is the imported monarch_fftconv (or None)."""

    def nominal(desc):
        return lambda u, k: dict(desc)

    ref_desc = {"backend": "torch.fft", "kernel": "cuFFT/pocketfft rfft+irfft, padded",
                "precision": "fp32"}
    methods: List[Method] = [
        Method("reference", "reference", None,
               build=lambda u, k, g: _fwd_bwd(reference_conv, u, k, g),
               describe=nominal(ref_desc),
               flops=lambda B, C, L, bwd, info: cufft_flops(B, C, L, filter_fft=True, backward=bwd)),
    ]

    def build_tuned(u, k, g):
        L = u.shape[-1]
        if g is None:
            k_f = torch.fft.rfft(k, n=2 * L)  # cached filter spectrum: outside the timed call
            return lambda: torch.fft.irfft(torch.fft.rfft(u, n=2 * L) * k_f, n=2 * L)[..., :L]

        def fn(uu, kk):  # training: the filter spectrum needs a gradient, so it's per call
            return torch.fft.irfft(torch.fft.rfft(uu, n=2 * L) * torch.fft.rfft(kk, n=2 * L),
                                   n=2 * L)[..., :L]
        return _fwd_bwd(fn, u, k, g)

    methods.append(Method(
        "cufft-tuned", "cufft", None, build=build_tuned,
        describe=nominal({"backend": "torch.fft", "kernel": "rfft(n=2L) + cached filter spectrum",
                          "precision": "fp32"}),
        flops=lambda B, C, L, bwd, info: cufft_flops(B, C, L, filter_fft=bwd, backward=bwd)))

    if compile:
        compiled = {}

        def build_compiled(u, k, g):
            if "fn" not in compiled:
                # Static shapes: each swept shape gets its own specialised graph (dynamo would
                # otherwise switch to a dynamic-shape graph at the second shape).
                try:
                    import torch._dynamo as dynamo
                    for knob in ("recompile_limit", "cache_size_limit"):
                        if hasattr(dynamo.config, knob):
                            setattr(dynamo.config, knob, max(64, getattr(dynamo.config, knob)))
                except Exception:  # noqa: BLE001
                    pass
                compiled["fn"] = torch.compile(reference_conv, dynamic=False)
            return _fwd_bwd(compiled["fn"], u, k, g)
        methods.append(Method(
            "compile-reference", "compile", None, build=build_compiled,
            describe=nominal({"backend": "torch.compile", "kernel": "inductor(reference)",
                              "precision": "fp32"}),
            flops=lambda B, C, L, bwd, info: cufft_flops(B, C, L, filter_fft=True, backward=bwd)))

    def monarch_flops(B, C, L, bwd, info):
        f = info.get("flops")
        if f is None:
            return None
        if bwd:
            # explain() describes one forward call; count backward only if the package says.
            fb = info.get("flops_backward")
            return None if fb is None else float(f) + float(fb)
        return float(f)

    def monarch_describe(p):
        def d(u, k):
            if mf is None or not hasattr(mf, "explain"):
                return {"backend": "?", "precision": p}
            try:
                info = mf.explain(u, k, precision=p)
                return dict(info) if isinstance(info, dict) else {"backend": str(info)}
            except Exception as e:  # noqa: BLE001
                return {"backend": "?", "precision": p,
                        "explain_error": f"{type(e).__name__}: {e}"}
        return d

    for p in PRECISIONS:
        def build_fn(u, k, g, p=p):
            if mf is None:
                raise RuntimeError(mf_error or "monarch_fftconv not available")
            return _fwd_bwd(lambda uu, kk: mf.fftconv(uu, kk, precision=p), u, k, g)
        methods.append(Method(f"monarch[{p}]", "monarch", p, build=build_fn,
                              describe=monarch_describe(p), flops=monarch_flops,
                              setup_error=None if mf is not None else mf_error))

    def build_module(u, k, g):
        if mf is None:
            raise RuntimeError(mf_error or "monarch_fftconv not available")
        B, C, L = u.shape
        m = mf.FFTConv(C, L).to(device=u.device)
        with torch.no_grad():
            m.filter.copy_(k.reshape(m.filter.shape))
        if g is None:
            def call():
                with torch.no_grad():   # inference: the module caches the filter spectrum
                    return m(u)
            return call
        u_r = u.detach().requires_grad_(True)

        def call_bwd():
            y = m(u_r)
            gu, gk = torch.autograd.grad(y, (u_r, m.filter), g)
            return y, gu, gk
        return call_bwd

    methods.append(Method("monarch-module", "monarch", None, build=build_module,
                          describe=monarch_describe(None), flops=monarch_flops,
                          setup_error=None if mf is not None else mf_error))
    if only:
        wanted = set(only)
        unknown = wanted - {m.name for m in methods}
        if unknown:
            raise SystemExit(f"unknown method(s) {sorted(unknown)}; "
                             f"known: {[m.name for m in methods]}")
        methods = [m for m in methods if m.name in wanted]
    return methods


# ----------------------------------------------------------------------------------------------
# Measurement
# ----------------------------------------------------------------------------------------------

def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_method(calls: Sequence[Callable[[], Any]], *, reps: int, warmup: int, device: str,
                flush: Optional[torch.Tensor] = None) -> List[float]:
    """Seconds per rep for `reps` calls, rotating through `calls` (one per input buffer set).

    GPU: each rep has its own CUDA event pair, so an optional L2 flush between reps (a write of
    `flush`) stays outside the timed region. CPU: time.perf_counter around each call.
    """
    n = len(calls)
    for i in range(max(warmup, n)):   # every buffer set at least once (plans, caches, compile)
        calls[i % n]()
    _sync(device)
    times: List[float] = []
    if device == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for i in range(reps):
            if flush is not None:
                flush.zero_()
            starts[i].record()
            calls[i % n]()
            ends[i].record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]
    else:
        for i in range(reps):
            if flush is not None:
                flush.zero_()
            t0 = time.perf_counter()
            out = calls[i % n]()
            t1 = time.perf_counter()
            del out
            times.append(t1 - t0)
    return times


def summarize(times: Sequence[float]) -> Dict[str, float]:
    """Median and inter-quartile range (seconds)."""
    ts = sorted(times)
    med = statistics.median(ts)
    if len(ts) >= 2:
        q1, _, q3 = statistics.quantiles(ts, n=4, method="inclusive")
    else:
        q1 = q3 = ts[0]
    return {"median_s": med, "q1_s": q1, "q3_s": q3, "iqr_s": q3 - q1,
            "min_s": ts[0], "max_s": ts[-1]}


def measure_error(out: torch.Tensor, ref: torch.Tensor, *, atol: float = ATOL,
                  rtol: float = RTOL) -> Dict[str, Any]:
    """Relative L2 error of `out` vs the float64 `ref`, and torch.allclose(atol, rtol)."""
    o = out.detach().to(torch.float64)
    r = ref.detach().to(torch.float64)
    if o.shape != r.shape:
        return {"rel_err": float("nan"), "max_abs_err": float("nan"), "allclose": False,
                "shape_mismatch": f"{tuple(o.shape)} vs {tuple(r.shape)}"}
    finite = bool(torch.isfinite(o).all())
    denom = torch.linalg.vector_norm(r).item()
    num = torch.linalg.vector_norm(o - r).item()
    rel = num / denom if denom > 0 else num
    return {"rel_err": rel if finite else float("inf"),
            "max_abs_err": (o - r).abs().max().item() if finite else float("inf"),
            "allclose": finite and bool(torch.allclose(o, r, atol=atol, rtol=rtol))}


def float64_reference(u: torch.Tensor, k: torch.Tensor, g: Optional[torch.Tensor]):
    """y (and grads w.r.t. u, k when g is given) by torch.fft in float64 on the same inputs."""
    u64 = u.detach().to(torch.float64).requires_grad_(g is not None)
    k64 = k.detach().to(torch.float64).requires_grad_(g is not None)
    with torch.set_grad_enabled(g is not None):
        y = reference_conv(u64, k64)
        if g is None:
            return y.detach(), None, None
        gu, gk = torch.autograd.grad(y, (u64, k64), g.to(torch.float64))
    return y.detach(), gu, gk


def copy_bandwidth(device: str, nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Device copy bandwidth in bytes/s: a large copy, (bytes read + bytes written) / time."""
    n = nbytes // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    _sync(device)
    ts = []
    if device == "cuda":
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            dst.copy_(src)
            e.record()
            e.synchronize()
            ts.append(s.elapsed_time(e) / 1e3)
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            dst.copy_(src)
            ts.append(time.perf_counter() - t0)
    del src, dst
    if device == "cuda":
        torch.cuda.empty_cache()
    return 2 * n * 4 / statistics.median(ts)


def validate_time(time_s: Optional[float], floor_s: Optional[float]) -> str:
    """'INVALID' if a measured time is under the memory floor (faster than just moving the
    compulsory bytes at the measured copy bandwidth: a timing or correctness bug, not a win),
    'OK' otherwise, 'UNCHECKED' when there is no floor or no time."""
    if time_s is None or floor_s is None or not math.isfinite(floor_s) or floor_s <= 0:
        return "UNCHECKED"
    if not math.isfinite(time_s) or time_s < floor_s:
        return "INVALID"
    return "OK"


def peak_extra_memory(call: Callable[[], Any], device: str) -> Optional[int]:
    """Peak GPU memory allocated during one call beyond what was allocated before (bytes,
    outputs included)."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return int(peak)


def count_kernel_launches(call: Callable[[], Any], device: str) -> Optional[Dict[str, int]]:
    """CUDA kernels (and memcpy/memset operations) of one call, from torch.profiler."""
    if device != "cuda":
        return None
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        out = call()
        torch.cuda.synchronize()
    del out
    kernels = memops = 0
    for ev in prof.events():
        if getattr(ev, "device_type", None) != DeviceType.CUDA:
            continue
        name = ev.name.lower()
        if name.startswith("memcpy") or name.startswith("memset"):
            memops += 1
        else:
            kernels += 1
    return {"kernels": kernels, "memops": memops}


class EnergyMeter:
    """Board energy from NVML (nvmlDeviceGetTotalEnergyConsumption, mJ since driver load)."""

    def __init__(self, device: str):
        self.handle = None
        self.note = None
        if device != "cuda":
            self.note = "energy skipped: no CUDA device"
            return
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml = pynvml
            handle = None
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            bus = getattr(props, "pci_bus_id", None)
            if bus is not None:   # map the torch device to the NVML device by PCI address
                dom = getattr(props, "pci_domain_id", 0)
                dev = getattr(props, "pci_device_id", 0)
                bus_id = f"{dom:08X}:{bus:02X}:{dev:02X}.0"
                for arg in (bus_id, bus_id.encode()):   # pynvml versions differ: str or bytes
                    try:
                        handle = pynvml.nvmlDeviceGetHandleByPciBusId(arg)
                        break
                    except Exception:  # noqa: BLE001
                        handle = None
            if handle is None:
                handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            self.handle = handle
            self.note = ("energy: NVML total board energy per call (includes idle/static power), "
                         "averaged over >= 1 s of back-to-back calls")
        except Exception as e:  # noqa: BLE001
            self.note = f"energy skipped: NVML unavailable ({type(e).__name__}: {e})"

    @property
    def available(self) -> bool:
        return self.handle is not None

    def per_call_mj(self, calls: Sequence[Callable[[], Any]], median_s: float,
                    min_seconds: float = 1.0, min_calls: int = 50) -> Optional[float]:
        if self.handle is None:
            return None
        n = max(min_calls, int(math.ceil(min_seconds / max(median_s, 1e-7))))
        torch.cuda.synchronize()
        e0 = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        for i in range(n):
            calls[i % len(calls)]()
        torch.cuda.synchronize()
        e1 = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        return (e1 - e0) / n


def _cache_bytes(device: str) -> int:
    if device == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2 = getattr(props, "L2_cache_size", 0) or 0
        return int(l2) if l2 > 0 else 60 * 2**20
    return 32 * 2**20   # a guess at a host's last-level cache


def buffer_plan(set_bytes: int, cache_bytes: int) -> Tuple[int, bool]:
    """(number of input buffer sets, whether an explicit cache flush is needed): enough sets that
    their total is >= 2x the cache; if that would take more than MAX_BUFFERS, flush instead."""
    need = max(2, math.ceil(2 * cache_bytes / max(set_bytes, 1)))
    if need <= MAX_BUFFERS:
        return need, False
    return 2, True


# ----------------------------------------------------------------------------------------------
# Running
# ----------------------------------------------------------------------------------------------

def _outputs_error(outs, refs) -> Dict[str, Any]:
    """Error fields for one method's outputs (y, or (y, grad_u, grad_k)) vs float64."""
    if not isinstance(outs, (tuple, list)):
        outs = (outs,)
    y_ref, gu_ref, gk_ref = refs
    res = measure_error(outs[0], y_ref)
    if gu_ref is not None:
        # Gradients: relative L2 error; allclose on each gradient scaled by its float64 RMS, since
        # grad_k sums B·L products and has no natural O(1) scale for an absolute tolerance.
        for name, o, r in (("grad_u", outs[1], gu_ref), ("grad_k", outs[2], gk_ref)):
            rms = r.pow(2).mean().sqrt().clamp_min(1e-300)
            e = measure_error(o.to(torch.float64) / rms, r / rms)
            res[f"{name}_rel_err"] = e["rel_err"]
            res[f"{name}_allclose"] = e["allclose"]
    return res


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if isinstance(x, torch.Tensor) and x.numel() == 1:
        return x.item()
    return str(x)


class _Progress:
    """tqdm if importable, else a simple printed counter (both on stderr)."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.i, self.bar = total, 0, None
        self.enabled = enabled
        if enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, file=sys.stderr, leave=False, dynamic_ncols=True)
            except Exception:  # noqa: BLE001
                self.bar = None

    def step(self, desc: str) -> None:
        self.i += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_description(desc)
            self.bar.update(1)
        else:
            print(f"  [{self.i}/{self.total}] {desc}", file=sys.stderr, flush=True)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_shape(shape: Tuple[int, int, int], methods: Sequence[Method], cfg: Dict[str, Any], *,
              backward: bool, copy_bw: float, energy: Optional[EnergyMeter], profile: bool,
              flush_l2: bool, seed: int, progress: _Progress) -> List[Dict[str, Any]]:
    B, C, L = shape
    device, reps, warmup = cfg["device"], cfg["reps"], cfg["warmup"]
    pass_name = "fwd+bwd" if backward else "fwd"
    nbytes = min_bytes(B, C, L, backward=backward)
    floor_s = nbytes / copy_bw if copy_bw > 0 else None
    set_bytes = 4 * (B * C * L * (2 if backward else 1) + C * L)
    n_buf, need_flush = buffer_plan(set_bytes, _cache_bytes(device))
    flush = None
    if flush_l2 or (need_flush and not cfg.get("quick")):
        # GPU: 256 MB (> 4x a 60 MB L2). CPU: 2x the assumed last-level cache.
        fbytes = FLUSH_BYTES if device == "cuda" else 2 * _cache_bytes(device)
        flush = torch.empty(fbytes // 4, dtype=torch.float32, device=device)

    # Generated on the device (a 64x768x8192 tensor takes seconds on the host).
    gen = torch.Generator(device=device).manual_seed(seed + 1000003 * L + 1009 * C + B)
    bufs = []
    for _ in range(n_buf):
        # u ~ N(0,1); k ~ N(0,1)/sqrt(L) so y = O(1), making atol=1e-2 meaningful.
        u = torch.randn(B, C, L, generator=gen, device=device)
        k = torch.randn(C, L, generator=gen, device=device) / math.sqrt(L)
        g = torch.randn(B, C, L, generator=gen, device=device) if backward else None
        bufs.append((u, k, g))
    refs = float64_reference(*bufs[0])

    # True only when neither rotation nor a flush keeps the inputs out of the cache (--quick).
    l2_resident = flush is None and n_buf * set_bytes < 2 * _cache_bytes(device)
    common = {"B": B, "C": C, "L": L, "shape": f"{B}x{C}x{L}", "pass": pass_name,
              "device": device, "reps": reps, "warmup": warmup, "n_buffers": n_buf,
              "l2_flush": flush is not None, "cache_resident_inputs": l2_resident,
              "min_bytes": nbytes,
              "floor_ms": floor_s * 1e3 if floor_s else None}
    rows: List[Dict[str, Any]] = []
    for m in methods:
        progress.step(f"{B}x{C}x{L} {pass_name} {m.name}")
        row = dict(common, method=m.name, family=m.family, requested_precision=m.precision,
                   status="ok", error=None)

        def describe():
            info = m.describe(bufs[0][0], bufs[0][1]) or {}
            row.update(backend=info.get("backend"), kernel=info.get("kernel"),
                       precision=info.get("precision", m.precision),
                       reason=info.get("reason"), fft_size=info.get("fft_size"),
                       factors=info.get("factors"))
            if info.get("explain_error"):
                row["explain_error"] = info["explain_error"]
            return info
        try:
            describe()
            if m.setup_error:
                raise RuntimeError(m.setup_error)
            calls = [m.build(u, k, g) for (u, k, g) in bufs]
            row.update(_outputs_error(calls[0](), refs))
            info = describe()   # again, after the first call (a lazy kernel build may have run)
            times = time_method(calls, reps=reps, warmup=warmup, device=device, flush=flush)
            st = summarize(times)
            row.update({k2[:-2] + "_ms": v * 1e3 for k2, v in st.items()})  # median_s -> median_ms
            med = st["median_s"]
            row["validity"] = validate_time(med, floor_s)
            row["gbps"] = nbytes / med / 1e9
            fl = m.flops(B, C, L, backward, info)
            row["flops"] = fl
            row["tflops"] = fl / med / 1e12 if fl else None
            row["peak_extra_mb"] = (lambda b: None if b is None else b / 2**20)(
                peak_extra_memory(calls[0], device))
            if profile:
                try:
                    launches = count_kernel_launches(calls[0], device)
                except Exception as e:  # noqa: BLE001
                    launches, row["profile_error"] = None, f"{type(e).__name__}: {e}"
                if launches is not None:
                    row["kernel_launches"] = launches["kernels"]
                    row["memops"] = launches["memops"]
            if energy is not None and energy.available:
                row["energy_mj"] = energy.per_call_mj(calls, med)
            del calls
        except Exception as e:  # noqa: BLE001 -- a failing method is a row, not a crash
            row["status"] = "error"
            row["error"] = f"{type(e).__name__}: {e}".strip()[:500]
            row["traceback"] = traceback.format_exc(limit=4)[-2000:]
            if device == "cuda":
                torch.cuda.empty_cache()
        rows.append(row)

    ref_row = next((r for r in rows if r["method"] == "reference" and r["status"] == "ok"), None)
    ref_ok = ref_row is not None and ref_row.get("validity") != "INVALID"
    for r in rows:
        ok = r["status"] == "ok" and r.get("validity") != "INVALID" and ref_ok
        r["speedup_vs_reference"] = (ref_row["median_ms"] / r["median_ms"]) if ok else None
    del bufs, refs, flush
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


# ----------------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------------

def environment(device: str) -> Dict[str, Any]:
    env = {"device": device, "torch_version": torch.__version__,
           "cuda_version": torch.version.cuda, "python": platform.python_version(),
           "platform": platform.platform(), "hostname": platform.node(),
           "timestamp_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    if device == "cuda":
        idx = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        env.update(gpu_name=torch.cuda.get_device_name(idx),
                   gpu_memory_gib=round(props.total_memory / 2**30, 1),
                   gpu_sm_count=props.multi_processor_count,
                   gpu_capability=f"{props.major}.{props.minor}",
                   l2_cache_bytes=_cache_bytes(device),
                   cuda_matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
                   timer="cuda-events (one pair per rep)")
    else:
        env.update(gpu_name=None, cpu=platform.processor() or platform.machine(),
                   threads=torch.get_num_threads(), timer="time.perf_counter",
                   note=CPU_NOTE)
    try:
        import subprocess
        env["git_commit"] = subprocess.run(
            ["git", "-C", _REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
            text=True, timeout=5).stdout.strip() or None
    except Exception:  # noqa: BLE001
        env["git_commit"] = None
    env["source_digest"] = source_digest()
    return env


def source_digest() -> str:
    """sha256 (12 hex digits) of the package and kernel sources this run imports and builds.
    Ties results to code even where the checkout's git metadata is stale or absent (a copied
    working tree on a device machine reports its copy's HEAD, not the code it carries)."""
    import hashlib
    h = hashlib.sha256()
    for sub, pattern in (("monarch_fftconv", "*.py"), ("monarch_fftconv/csrc", "*")):
        for path in sorted((Path(_REPO) / sub).glob(pattern)):
            if path.is_file():
                h.update(path.name.encode())
                h.update(path.read_bytes())
    return h.hexdigest()[:12]


def _fmt(v, spec: str = ".3g", none: str = "-") -> str:
    if v is None:
        return none
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def format_targets(rows: Sequence[Dict[str, Any]]) -> str:
    """The tensor-core kernel against its targets on the reference workload ('' if not run)."""
    ref = next((r for r in rows if r["shape"] == TARGET_SHAPE and r["pass"] == "fwd"
                and r["method"] == "reference" and r["status"] == "ok"), None)
    lines = []
    for prec, (t_ms, budget) in TARGETS.items():
        r = next((r for r in rows if r["shape"] == TARGET_SHAPE and r["pass"] == "fwd"
                  and r["method"] == f"monarch[{prec}]" and r["status"] == "ok"), None)
        if r is None or r.get("validity") == "INVALID":
            continue
        ms, err, tf = r["median_ms"], r.get("rel_err"), r.get("tflops")
        time_txt = "-" if t_ms is None else (
            f"<= {t_ms:.2f}: " + ("met" if ms <= t_ms else f"MISSED by {ms / t_ms:.2f}x"))
        err_txt = f"{err:.2e} (<= {budget:.0e}: " + ("met)" if err is not None and err <= budget
                                                     else "MISSED)")
        lines.append([prec, r.get("backend") or "-", f"{ms:.4f}", time_txt,
                      f"{ref['median_ms'] / ms:.2f}x" if ref else "-", err_txt,
                      f"{tf:.0f} ({100 * tf / CEILING_TFLOPS[prec]:.0f}% of {CEILING_TFLOPS[prec]:.0f})"
                      if tf else "-",
                      f"{r['floor_ms'] / ms:.0%}" if r.get("floor_ms") else "-"])
    if not lines:
        return ""
    cols = ["precision", "backend", "median ms", "time target ms", "vs reference",
            "rel. L2 err (budget)", "TFLOP/s (of ceiling)", "memory floor / time"]
    widths = [max(len(c), *(len(t[i]) for t in lines)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(str(v).ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    return "\n".join([f"Targets (issue #3): {TARGET_SHAPE} forward, fp32 I/O",
                      line(cols), line(["-" * w for w in widths]), *map(line, lines)])


def format_table(rows: Sequence[Dict[str, Any]]) -> str:
    """Plain-text table for one shape/pass."""
    if not rows:
        return ""
    r0 = rows[0]
    head = (f"{r0['shape']} (BxCxL, float32)  pass={r0['pass']}  reps={r0['reps']}  "
            f"buffers={r0['n_buffers']}{' +L2 flush' if r0['l2_flush'] else ''}"
            f"{' (inputs cache-resident: --quick)' if r0.get('cache_resident_inputs') else ''}  "
            f"memory floor={_fmt(r0['floor_ms'], '.4f')} ms")
    cols = ["method", "backend", "prec", "median ms", "IQR ms", "check", "speedup", "GB/s",
            "TFLOP/s", "rel err", "allclose", "peak MB", "kernels", "mJ/call"]
    table = []
    for r in rows:
        if r["status"] != "ok":
            table.append([r["method"], r.get("backend") or "-", r.get("precision") or "-",
                          "ERROR", "", "", "", "", "", "", "", "", "", ""])
            continue
        ac = "yes" if r.get("allclose") else "NO"
        if "grad_u_allclose" in r:
            ac += "/" + ("yes" if r["grad_u_allclose"] and r["grad_k_allclose"] else "NO")
        err = _fmt(r.get("rel_err"), ".2e")
        if "grad_u_rel_err" in r:
            err += f" (du {_fmt(r['grad_u_rel_err'], '.1e')}, dk {_fmt(r['grad_k_rel_err'], '.1e')})"
        sp = r.get("speedup_vs_reference")
        accurate = r.get("allclose") and r.get("grad_u_allclose", True) and r.get("grad_k_allclose", True)
        sp_txt = "INVALID" if r["validity"] == "INVALID" else (
            (_fmt(sp, ".2f") + "x" + ("" if accurate else "*")) if sp else "-")
        table.append([
            r["method"], r.get("backend") or "-", r.get("precision") or "-",
            _fmt(r["median_ms"], ".4f"), _fmt(r["iqr_ms"], ".4f"), r["validity"], sp_txt,
            _fmt(r.get("gbps"), ".3g"), _fmt(r.get("tflops"), ".3g"), err, ac,
            _fmt(r.get("peak_extra_mb"), ".1f"), _fmt(r.get("kernel_launches"), "d"),
            _fmt(r.get("energy_mj"), ".2f")])
    widths = [max(len(c), *(len(str(t[i])) for t in table)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(str(v).ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    out = [head, line(cols), line(["-" * w for w in widths])] + [line(t) for t in table]
    if any(t[6].endswith("*") for t in table):
        out.append("  * fails allclose(atol=1e-2, rtol=1e-2) vs float64: the speedup is not "
                   "at equal accuracy")
    if any(r.get("validity") == "INVALID" for r in rows):
        out.append("  INVALID: median time under the memory floor (compulsory bytes / measured "
                   "copy bandwidth): a measurement or correctness bug, not a speedup")
    errs = [r for r in rows if r["status"] != "ok"]
    for r in errs:
        out.append(f"  ! {r['method']}: {r['error']}")
    return "\n".join(out)


CSV_FIELDS = ["shape", "B", "C", "L", "pass", "device", "method", "family", "backend", "kernel",
              "requested_precision", "precision", "status", "median_ms", "q1_ms", "q3_ms",
              "iqr_ms", "min_ms", "max_ms", "reps", "n_buffers", "l2_flush",
              "cache_resident_inputs", "floor_ms",
              "validity", "speedup_vs_reference", "min_bytes", "gbps", "flops", "tflops",
              "rel_err", "max_abs_err", "allclose", "grad_u_rel_err", "grad_u_allclose",
              "grad_k_rel_err", "grad_k_allclose", "peak_extra_mb", "kernel_launches", "memops",
              "energy_mj", "fft_size", "factors", "reason", "error"]


def write_outputs(out_dir: str, meta: Dict[str, Any], rows: Sequence[Dict[str, Any]]) -> Dict[str, str]:
    """results.json (meta + rows) and results.csv (one row per method x shape x pass)."""
    os.makedirs(out_dir, exist_ok=True)
    jpath = os.path.join(out_dir, "results.json")
    cpath = os.path.join(out_dir, "results.csv")
    with open(jpath, "w") as f:
        json.dump(_json_safe({**meta, "results": list(rows)}), f, indent=2, allow_nan=False)
    with open(cpath, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})
    return {"json": jpath, "csv": cpath}


def plot(out_dir: str, rows: Sequence[Dict[str, Any]], meta: Dict[str, Any]) -> List[str]:
    """PNG plots: time vs L (log), speedup over the reference, error per precision."""
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    import _plots
    return _plots.make_plots(out_dir, rows, meta)


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    args = parse_args(argv)
    threads = args.threads if args.threads is not None else (1 if args.quick else None)
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(old_threads)


def _run(args: argparse.Namespace) -> Dict[str, Any]:
    cfg = resolve_config(args)
    device = cfg["device"]
    torch.manual_seed(args.seed)
    mf, mf_error = _import_monarch()
    only = [s.strip() for s in args.methods.split(",") if s.strip()] if args.methods else None
    methods = make_methods(compile=args.compile, mf=mf, mf_error=mf_error, only=only)

    env = environment(device)
    env["monarch_fftconv_version"] = getattr(mf, "__version__", None) if mf else None
    if mf_error:
        env["monarch_fftconv_import_error"] = mf_error
    print("=" * 100)
    print(f"monarch_fftconv vs cuFFT benchmark (sources {env['source_digest']}, "
          f"git {env.get('git_commit') or '?'})")
    if device == "cuda":
        print(f"GPU: {env['gpu_name']} ({env['gpu_memory_gib']} GiB, sm_{env['gpu_capability']}, "
              f"L2 {env['l2_cache_bytes'] / 2**20:.0f} MiB) | torch {env['torch_version']} | "
              f"CUDA {env['cuda_version']}")
    else:
        print(f"DEVICE: CPU ({env['cpu']}, {env['threads']} threads) | torch {env['torch_version']}"
              f" | CUDA {env['cuda_version']}")
        print("*** " + CPU_NOTE + " ***")
    if device == "cuda" and cfg["reps"] < 30 and not args.quick:
        print(f"warning: --reps {cfg['reps']} < 30: medians/IQRs will be noisy")
    if mf_error:
        print(f"warning: {mf_error} -- monarch methods will be error rows")

    # Large enough to stream from DRAM (a 60 MB L2 must not hold src + dst).
    if device == "cuda":
        cb_bytes = (256 << 20) if args.quick else (1 << 30)
    else:
        cb_bytes = (16 << 20) if args.quick else (256 << 20)
    copy_bw = copy_bandwidth(device, cb_bytes)
    print(f"copy bandwidth (measured, {cb_bytes >> 20} MiB {device} copy, read+write): "
          f"{copy_bw / 1e9:.0f} GB/s; memory floor = compulsory bytes / that")
    energy = EnergyMeter(device) if args.energy else None
    if energy is not None:
        print(energy.note)
    print("=" * 100, flush=True)

    total = len(cfg["shapes"]) * len(methods)
    progress = _Progress(total, enabled=True)
    rows: List[Dict[str, Any]] = []
    try:
        for shape in cfg["shapes"]:
            srows = run_shape(shape, methods, cfg, backward=args.backward, copy_bw=copy_bw,
                              energy=energy, profile=not args.no_profile, flush_l2=args.flush_l2,
                              seed=args.seed, progress=progress)
            rows.extend(srows)
            progress.write("\n" + format_table(srows) + "\n")
    finally:
        progress.close()

    if device == "cuda" and (targets := format_targets(rows)):
        print(targets + "\n")
    n_invalid = sum(r.get("validity") == "INVALID" for r in rows)
    n_err = sum(r["status"] != "ok" for r in rows)
    meta = {"benchmark": "bench_cufft", **env,
            "args": {k: v for k, v in vars(args).items()},
            "shapes": [list(s) for s in cfg["shapes"]], "reps": cfg["reps"],
            "warmup": cfg["warmup"], "pass": "fwd+bwd" if args.backward else "fwd",
            "copy_bandwidth_gbps": copy_bw / 1e9, "copy_bytes": cb_bytes,
            "tolerance": {"atol": ATOL, "rtol": RTOL},
            "energy_note": energy.note if energy else "energy not requested (--energy)",
            "gbps_definition": "compulsory bytes (min_bytes: u + k read, y written; with --backward "
                               "also grad_y read, grad_u and grad_k written) / median time",
            "flops_convention": ("cuFFT methods: 2.5*N*log2(N) per real FFT of N=2L points + 6 "
                                 "per complex multiply; monarch methods: explain()['flops'] (one forward call incl. the filter transform, so slightly high for the cached monarch-module; fwd+bwd only if explain gives 'flops_backward')"),
            "inputs": "u ~ N(0,1) (B,C,L) float32; k ~ N(0,1)/sqrt(L) (C,L) float32",
            "n_invalid": n_invalid, "n_errors": n_err}
    paths = write_outputs(args.out, meta, rows)
    plots: List[str] = []
    if not args.no_plots:
        try:
            plots = plot(args.out, rows, meta)
        except Exception as e:  # noqa: BLE001
            print(f"warning: plotting failed: {type(e).__name__}: {e}")
    print(f"{len(rows)} rows ({n_err} errors, {n_invalid} INVALID) -> {paths['json']}, "
          f"{paths['csv']}" + (f", {len(plots)} plots" if plots else ""))
    if device == "cpu":
        print("reminder: " + CPU_NOTE)
    return {"meta": meta, "rows": rows, "paths": paths, "plots": plots}


if __name__ == "__main__":
    main()
