"""Command line: the arguments, the concrete configuration of a run (device, shapes, reps), main."""
from __future__ import annotations

import argparse
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

import fftconv_bench
from fftconv_bench.operators import OPERATORS
from fftconv_bench.timing import CPU_WARMUP_SECONDS, GPU_WARMUP_SECONDS, MAX_SPREAD

Shape = Tuple[int, int, int]

# --io-dtype: the dtype of every tensor a method takes and returns (inputs are drawn in float32
# and cast to it, so each dtype sees the same values up to its rounding).
IO_DTYPES: Dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                                     "float16": torch.float16}

PRESETS: Dict[str, List[Shape]] = {
    "seed": [(16, 256, 8192)],
    "lengths": [(16, 256, L) for L in (1024, 2048, 4096, 8192, 16384)],
    "hyena": [(64, 768, 8192)],
    # FlashFFTConv's published gated fp16 shape (FFT size 16K): issue #30 asks for this package's
    # time there in each precision (--operator gated --io-dtype float16)
    "flashfftconv": [(64, 768, 8192)],
    # long sequences, each shape holding 2^27 input elements (512 MB of fp32 u)
    "long": [(32, 256, 16384), (8, 256, 65536), (4, 256, 131072), (1, 128, 1 << 20), (1, 32, 1 << 22)],
}
CPU_DEFAULT_SHAPES: List[Shape] = [(2, 4, 2048)]
QUICK_SHAPES: List[Shape] = [(1, 2, 256)]
GPU_DEFAULT_REPS = 50
CPU_DEFAULT_REPS = 10
QUICK_REPS = 3
DEFAULT_WARMUP = 10
QUICK_WARMUP = 1


def parse_shapes(spec: str) -> List[Shape]:
    """'16x256x8192,16x256x1024' -> [(16, 256, 8192), (16, 256, 1024)]. Raises ValueError."""
    shapes = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            dims = tuple(int(p) for p in item.lower().split("x"))
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


def _shapes_type(spec: str) -> List[Shape]:
    try:
        return parse_shapes(spec)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench_cufft.py",
        description="Benchmark monarch_fftconv against torch.fft (cuFFT on a GPU) causal "
                    "convolution.",
        epilog=fftconv_bench.__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--shapes", type=_shapes_type, default=None,
                   help="comma-separated BxCxL list, e.g. 16x256x8192,16x256x1024")
    g.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="seed: 16x256x8192; lengths: B=16,C=256,L=1024..16384; hyena: 64x768x8192; "
                        "flashfftconv: 64x768x8192, FlashFFTConv's gated fp16 shape (with "
                        "--operator gated --io-dtype float16); "
                        "long: L=16384..4M, 2^27 input elements each")
    p.add_argument("--backward", action="store_true",
                   help="time a training step, forward+backward (grads w.r.t. u and k), "
                        "instead of forward only: each method by torch.autograd.grad and, as "
                        "<method>.backward, by y.backward with accumulation into .grad")
    p.add_argument("--io-dtype", choices=list(IO_DTYPES), default="float32",
                   help="dtype of every input (u, k, the operator's D and gates, grad_y with "
                        "--backward), drawn in float32 and cast to it; the float64 reference is computed from the cast values, the memory "
                        "floor and GB/s count its element size (default: float32)")
    p.add_argument("--operator", choices=list(OPERATORS), default="plain",
                   help="what every method computes (issue #30): plain, y = conv(u, k); gated, "
                        "y = postgate*(conv(x, k) + D*x), x = pregate*u; grouped, C/16 filters "
                        "each shared by 16 channels; bidirectional, (C, 2, L) causal and "
                        "anti-causal filters. Methods without a form of it are skipped, saying "
                        "why (default: plain)")
    p.add_argument("--compile", action="store_true", help="also time torch.compile(reference)")
    p.add_argument("--energy", action="store_true", help="measure energy per call with NVML")
    p.add_argument("--reps", type=int, default=None,
                   help=f"timed reps (default {GPU_DEFAULT_REPS} on GPU, "
                        f"{CPU_DEFAULT_REPS} on CPU)")
    p.add_argument("--warmup", type=int, default=None,
                   help=f"warm-up calls at least (default {DEFAULT_WARMUP}; quick {QUICK_WARMUP})")
    p.add_argument("--warmup-seconds", type=float, default=None,
                   help=f"warm-up time per method at least (default {GPU_WARMUP_SECONDS:g} s on GPU, "
                        f"{CPU_WARMUP_SECONDS:g} s on CPU, 0 with --quick); the warm-up then goes "
                        f"on until two windows of calls agree")
    p.add_argument("--max-spread", type=float, default=MAX_SPREAD,
                   help="IQR / median above which a row is marked NOISY and gets no speedup "
                        "(default %(default)s)")
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
                   help="torch CPU threads for this run (default: 1 on CPU, where a core busy "
                        "with another process stalls every parallel region, and with --quick; "
                        "unchanged on GPU)")
    p.add_argument("--seed", type=int, default=0, help="input RNG seed (default: 0)")
    p.add_argument("--out", default="bench_out", help="output directory (default: bench_out)")
    return p


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.reps is not None and args.reps < 1:
        parser.error("--reps must be >= 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    if args.warmup is not None and args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.warmup_seconds is not None and args.warmup_seconds < 0:
        parser.error("--warmup-seconds must be >= 0")
    if not args.max_spread > 0:
        parser.error("--max-spread must be > 0")
    return args


def resolve_config(args: argparse.Namespace) -> Dict[str, Any]:
    """Turn parsed args into the concrete device / shapes / reps / warm-up of this run."""
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
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
    for _, C, _ in shapes:
        problem = OPERATORS[args.operator].shape_problem(C)
        if problem:
            raise SystemExit(problem)
    if args.reps is not None:
        reps = args.reps
    elif args.quick:
        reps = QUICK_REPS
    else:
        reps = GPU_DEFAULT_REPS if device == "cuda" else CPU_DEFAULT_REPS
    warmup = args.warmup if args.warmup is not None else (
        QUICK_WARMUP if args.quick else DEFAULT_WARMUP)
    if args.warmup_seconds is not None:
        warmup_seconds = args.warmup_seconds
    elif args.quick:
        warmup_seconds = 0.0
    else:
        warmup_seconds = GPU_WARMUP_SECONDS if device == "cuda" else CPU_WARMUP_SECONDS
    # One thread on the host: with torch's default (every core) a core that another process
    # holds stalls each parallel region by a scheduler slice, here 0.15 ms calls took 24-48 ms.
    # (--quick, the tests' smoke run, takes one on a GPU machine too.)
    threads = args.threads if args.threads is not None else (
        1 if device == "cpu" or args.quick else None)
    return {"device": device, "shapes": [tuple(s) for s in shapes], "reps": reps, "warmup": warmup,
            "warmup_seconds": warmup_seconds, "max_spread": args.max_spread, "threads": threads,
            "quick": bool(args.quick), "io_dtype": args.io_dtype, "operator": args.operator}


def method_names(spec: Optional[str]) -> Optional[List[str]]:
    """--methods 'a, b' -> ['a', 'b']; None when not given (all methods)."""
    if not spec:
        return None
    return [s.strip() for s in spec.split(",") if s.strip()] or None


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Parse argv and run the benchmark with the requested CPU threads: {meta, rows, paths,
    plots}."""
    from fftconv_bench import runner   # imports monarch_fftconv: after argument errors are shown

    args = parse_args(argv)
    cfg = resolve_config(args)
    threads_before = torch.get_num_threads()
    if cfg["threads"] is not None:
        torch.set_num_threads(cfg["threads"])
    try:
        return runner.run(args, cfg)
    finally:
        torch.set_num_threads(threads_before)
