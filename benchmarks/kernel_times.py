#!/usr/bin/env python
"""GPU time per kernel of one call (torch.profiler, CUDA activity), to see which launch of a
multi-launch path (four-step, backward) dominates. Medians over --reps calls, after warm-up.

    python benchmarks/kernel_times.py --shape 1x128x1048576 --precision bf16
    python benchmarks/kernel_times.py --shape 8x256x65536 --backward
    python benchmarks/kernel_times.py --shape 3x5x1000 --flush-l2   # as bench_cufft.py times tiny shapes
    python benchmarks/kernel_times.py --shape 16x256x8192 --backward --io-dtype bfloat16   # bf16 u, k, dy

--flush-l2 writes a buffer of twice the L2 before every call (outside the timed kernels), as the
benchmark does where its inputs are too small to rotate through: each call then also fetches its
kernels' instructions from DRAM, as it does in a model whose other layers evict L2 between calls.
"""
from __future__ import annotations

import argparse
import collections
import statistics

import torch

import monarch_fftconv as mf


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="1x128x1048576")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--backward", action="store_true", help="a training step: forward and backward")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--flush-l2", action="store_true", help="evict L2 before every call")
    p.add_argument("--io-dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="dtype of u, k and dy (the kernels' I/O)")
    args = p.parse_args()
    b, c, length = (int(x) for x in args.shape.split("x"))
    io_dtype = getattr(torch, args.io_dtype)
    u = torch.randn(b, c, length, device="cuda", dtype=io_dtype, requires_grad=args.backward)
    k = (torch.randn(c, length, device="cuda") / length**0.5).to(io_dtype).requires_grad_(args.backward)
    g = torch.randn_like(u)
    flush = None
    if args.flush_l2:
        flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.uint8, device="cuda")

    def call():
        if flush is not None:
            flush.zero_()
        y = mf.fftconv(u, k, precision=args.precision)
        if args.backward:
            torch.autograd.grad(y, (u, k), g)

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    times = collections.defaultdict(list)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.reps):
            call()
        torch.cuda.synchronize()
    for event in prof.events():
        # the flush's fill kernel is not the call's
        if event.device_type == torch.autograd.DeviceType.CUDA and not (flush is not None and "fill" in event.name.lower()):
            times[event.name].append(event.device_time)
    print(f"{args.shape} {args.io_dtype} I/O, {args.precision} {'fwd+bwd' if args.backward else 'fwd'}: "
          f"{mf.explain(u, k, precision=args.precision)['kernel']}{', L2 flushed before each call' if args.flush_l2 else ''}")
    total = 0.0
    for name, t in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        per_call = sum(t) / args.reps
        total += per_call
        print(f"  {per_call / 1e3:8.3f} ms/call  {len(t) // args.reps:2d} launches  median {statistics.median(t):9.1f} µs  "
              f"{name[:110]}")
    print(f"  {total / 1e3:8.3f} ms/call in kernels")


if __name__ == "__main__":
    main()
