#!/usr/bin/env python
"""GPU time per kernel of one call (torch.profiler, CUDA activity), to see which launch of a
multi-launch path (four-step, backward) dominates. Medians over --reps calls, after warm-up.

    python benchmarks/kernel_times.py --shape 1x128x1048576 --precision bf16
    python benchmarks/kernel_times.py --shape 8x256x65536 --backward
    python benchmarks/kernel_times.py --shape 3x5x1000 --flush-l2   # as bench_cufft.py times tiny shapes
    python benchmarks/kernel_times.py --shape 16x256x8192 --backward --io-dtype bfloat16   # bf16 u, k, dy
    python benchmarks/kernel_times.py --shape 16x256x8192 --backward --groups 16   # 16 filters, each for 16 channels
    python benchmarks/kernel_times.py --shape 16x256x4096 --fwd-uniform-pairs-ab   # the forward's pair sweep, =0 vs =1
    python benchmarks/kernel_times.py --shape 16x264x8192 --precision bf16 \
        --env-ab MONARCH_FFTCONV_ENGINE_EARLY_FILTER_RELEASE=0,1   # any switch the binding reads per call

--flush-l2 writes a buffer of twice the L2 before every call (outside the timed kernels), as the
benchmark does where its inputs are too small to rotate through: each call then also fetches its
kernels' instructions from DRAM, as it does in a model whose other layers evict L2 between calls.

--fwd-uniform-pairs-ab times the fp32 forward kernel with MONARCH_FFTCONV_FWD_UNIFORM_PAIRS=0
(thread 0's own path) and =1 (the uniform pair sweep) in one process, the calls alternating (the
binding reads the variable at each call), and prints both kernels' medians and their ratio.

--env-ab NAME=A,B (repeatable: the settings are the combinations, in order) alternates the call
(with --backward, the training step) with each setting of the variables, rep by rep in one process, and prints each kernel's median
per setting, a call's launches of it summed (the profile is cut into calls by each setting's launch
count, so a setting may launch other kernels or fewer), and the
call's wall time per setting (CUDA events around each call: what programmatic dependent launch
changes shows there, not in a kernel's own time).
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the checkout's package, where none is installed

import monarch_fftconv as mf

FWD_UNIFORM_PAIRS_ENV = "MONARCH_FFTCONV_FWD_UNIFORM_PAIRS"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="1x128x1048576")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--backward", action="store_true", help="a training step: forward and backward")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--flush-l2", action="store_true", help="evict L2 before every call")
    p.add_argument("--io-dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="dtype of u, k and dy (the kernels' I/O)")
    p.add_argument("--fwd-uniform-pairs-ab", action="store_true",
                   help=f"alternate {FWD_UNIFORM_PAIRS_ENV}=0 and =1 call by call; compare the forward kernels")
    p.add_argument("--groups", type=int, default=None, metavar="G",
                   help="a grouped filter bank of G rows (G dividing C): where a grouped call's time goes")
    p.add_argument("--env-ab", action="append", default=[], metavar="NAME=A,B",
                   help="alternate the call over these settings of NAME (repeatable: all combinations)")
    args = p.parse_args()
    if args.env_ab:
        if args.fwd_uniform_pairs_ab:
            p.error("--env-ab and --fwd-uniform-pairs-ab: one A/B at a time")
        env_ab(args)
        return
    run, flush, u, k = workload(args)

    def call():
        flush()
        run()

    # the settings each rep runs, in turn: the environment's, or both sides of the A/B
    settings = ("0", "1") if args.fwd_uniform_pairs_ab else (os.environ.get(FWD_UNIFORM_PAIRS_ENV),)
    if args.fwd_uniform_pairs_ab and FWD_UNIFORM_PAIRS_ENV in os.environ:
        p.error(f"--fwd-uniform-pairs-ab sets {FWD_UNIFORM_PAIRS_ENV} itself: unset it")
    calls_per_rep = len(settings)

    def set_uniform_pairs(value: str | None) -> None:
        if value is None:
            os.environ.pop(FWD_UNIFORM_PAIRS_ENV, None)
        else:
            os.environ[FWD_UNIFORM_PAIRS_ENV] = value

    for _ in range(3):
        for value in settings:
            set_uniform_pairs(value)
            call()
    torch.cuda.synchronize()
    times = collections.defaultdict(list)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.reps):
            for value in settings:
                set_uniform_pairs(value)
                call()
        torch.cuda.synchronize()
    set_uniform_pairs(settings[0] if not args.fwd_uniform_pairs_ab else None)  # as it was
    for name, t in device_events(prof, args.flush_l2):
        times[name].append(t)
    grouped = f" G={args.groups}" if args.groups else ""
    print(f"{args.shape}{grouped} {args.io_dtype} I/O, {args.precision} {'fwd+bwd' if args.backward else 'fwd'}: "
          f"{mf.explain(u, k, precision=args.precision)['kernel']}{', L2 flushed before each call' if args.flush_l2 else ''}")
    if args.fwd_uniform_pairs_ab:
        print(f"  (each rep: a call with {FWD_UNIFORM_PAIRS_ENV}=0, then one with =1; per call: half of each)")
    total = 0.0
    for name, t in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        per_call = sum(t) / (args.reps * calls_per_rep)
        total += per_call
        print(f"  {per_call / 1e3:8.3f} ms/call  {len(t) / (args.reps * calls_per_rep):4.1f} launches  "
              f"median {statistics.median(t):9.1f} µs  {name[:110]}")
    print(f"  {total / 1e3:8.3f} ms/call in kernels")
    if args.fwd_uniform_pairs_ab:
        forward_ab(times)


def workload(args) -> tuple[Callable[[], torch.Tensor], Callable[[], None], torch.Tensor, torch.Tensor]:
    """The timed call on fixed random inputs of --shape and --io-dtype (the forward, or with
    --backward a training step; it returns y), the L2 flush to run before it (a no-op without
    --flush-l2), and u and k."""
    b, c, length = (int(x) for x in args.shape.split("x"))
    filters = c if args.groups is None else args.groups
    if filters < 1 or c % filters:
        raise SystemExit(f"--groups {args.groups}: must be a divisor of C = {c}")
    io_dtype = getattr(torch, args.io_dtype)
    u = torch.randn(b, c, length, device="cuda", dtype=io_dtype, requires_grad=args.backward)
    k = (torch.randn(filters, length, device="cuda") / length**0.5).to(io_dtype).requires_grad_(args.backward)
    g = torch.randn_like(u)
    buffer = None
    if args.flush_l2:
        buffer = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.uint8, device="cuda")

    def run() -> torch.Tensor:
        y = mf.fftconv(u, k, precision=args.precision)
        if args.backward:
            torch.autograd.grad(y, (u, k), g)
        return y

    def flush() -> None:
        if buffer is not None:
            buffer.zero_()

    return run, flush, u, k


def device_events(prof, flush_l2: bool) -> list[tuple[str, float]]:
    """The profile's kernel (and memset) launches in launch order: (name, µs); with --flush-l2,
    the flush's fill kernel left out (it is not the call's)."""
    return [(e.name, e.device_time) for e in sorted(prof.events(), key=lambda e: e.time_range.start)
            if e.device_type == torch.autograd.DeviceType.CUDA and not (flush_l2 and "fill" in e.name.lower())]


def split_calls(events: list, launches: list[int], reps: int) -> tuple[list[dict], list[collections.Counter]]:
    """The profile of `reps` rounds of the settings' calls, in launch order ((name, µs) each), cut
    into calls by each setting's launch count: per setting, each kernel's µs in each call (its
    launches in a call summed), and how many launches of it one call makes."""
    if len(events) != reps * sum(launches):
        raise SystemExit(f"--env-ab: {len(events)} launches profiled, {reps} x {launches} expected")
    per_setting = [collections.defaultdict(list) for _ in launches]
    counts = [collections.Counter() for _ in launches]
    at = 0
    for rep in range(reps):
        for i, count in enumerate(launches):
            in_call = collections.Counter()
            for name, t in events[at:at + count]:
                in_call[name] += t
                counts[i][name] += rep == 0
            for name, t in in_call.items():
                per_setting[i][name].append(t)
            at += count
    return per_setting, counts


def env_ab(args) -> None:
    """--env-ab: each setting (a combination of the variables' values) in turn, rep by rep."""
    import itertools
    run, flush, _, _ = workload(args)
    names, values = [], []
    for spec in args.env_ab:
        name, _, vals = spec.partition("=")
        names.append(name)
        values.append(vals.split(","))
    settings = [dict(zip(names, combo)) for combo in itertools.product(*values)]
    saved = {n: os.environ.get(n) for n in names}

    def call(setting):
        os.environ.update(setting)
        flush()
        return run()

    outputs = [call(s) for s in settings]
    same = all(torch.equal(outputs[0], o) for o in outputs[1:])
    for _ in range(3):
        for s in settings:
            call(s)
    torch.cuda.synchronize()
    # A setting may launch other kernels, or fewer (a switch picks another instance or drops a
    # pass): count each one's launches, so the timed profile is cut into calls by count, not
    # told apart by kernel name.
    launches = []
    for s in settings:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as one:
            call(s)
            torch.cuda.synchronize()
        launches.append(len(device_events(one, args.flush_l2)))
    wall = collections.defaultdict(list)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.reps):
            for i, s in enumerate(settings):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                os.environ.update(s)
                flush()
                start.record()
                run()
                end.record()
                end.synchronize()
                wall[i].append(start.elapsed_time(end) * 1e3)
        torch.cuda.synchronize()
    for n, v in saved.items():
        if v is None:
            os.environ.pop(n, None)
        else:
            os.environ[n] = v
    events = device_events(prof, args.flush_l2)
    per_setting, counts = split_calls(events, launches, args.reps)
    print(f"{args.shape} {args.io_dtype} I/O, {args.precision} {'fwd+bwd' if args.backward else 'fwd'}, "
          f"{len(settings)} settings alternating, "
          f"{args.reps} reps{', L2 flushed before each call' if args.flush_l2 else ''}; outputs bit-identical "
          f"across settings: {same}")
    for i, s in enumerate(settings):
        label = " ".join(f"{n}={v}" for n, v in s.items())
        print(f"  [{i}] {label}: call wall median {statistics.median(wall[i]):9.1f} µs")
        for name, times in sorted(per_setting[i].items(), key=lambda kv: -sum(kv[1])):
            n = counts[i][name]
            print(f"      median {statistics.median(times):9.1f} µs{f' ({n} launches)' if n > 1 else ''}  {name[:100]}")


def forward_ab(times: dict[str, list[float]]) -> None:
    """The fp32 forward kernels' medians: thread 0's own path (fftconv_fp32[_gated]_kernel) and
    the uniform pair sweep (fftconv_fp32[_gated]_uniform_pairs_kernel), and their ratio."""
    def median_of(uniform: bool) -> float | None:
        picked = [t for name, ts in times.items() for t in ts
                  if "fftconv_fp32" in name and ("uniform_pairs_kernel" in name) == uniform
                  and ("fftconv_fp32_kernel" in name or "fftconv_fp32_gated_kernel" in name
                       or "uniform_pairs_kernel" in name)]
        return statistics.median(picked) if picked else None
    own, uniform = median_of(False), median_of(True)
    if own is None or uniform is None:
        print("  forward A/B: the fp32 forward kernel did not run both ways (not the fp32 radix kernel, or N < 1024)")
        return
    print(f"  forward A/B: thread 0's own path {own:9.1f} µs, uniform pairs {uniform:9.1f} µs, "
          f"uniform/own {uniform / own:.3f}")


if __name__ == "__main__":
    main()
