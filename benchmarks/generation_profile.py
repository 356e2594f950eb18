#!/usr/bin/env python
"""Where a graphed generation's GPU time goes: every token of an FFTConv-style stream (the
functional prefill/step, CUDA graphs) under torch.profiler, CUDA activity; kernel time by name,
per token, and the loop's wall time (under the profiler: longer than a plain run's).

    python benchmarks/generation_profile.py --shape 16x1024x65536
    python benchmarks/generation_profile.py --shape 1x256x8192 --direct-step   # generation.DIRECT_STEP on

Session 24 (H100, B16 C1024 L65536): 11.9 µs of kernels a token, of which the step kernel 3.65,
the copy of x_t 3.42 (two kernels: the example's x is a 4 GiB tensor, so TensorIterator splits the
copy of its (B, C) view for 64-bit offsets), the index increment 1.35.
"""
from __future__ import annotations

import argparse
import collections
import time

import torch

from monarch_fftconv import generation


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="16x1024x65536", help="BxCxL: L tokens generated from an empty prompt")
    p.add_argument("--direct-step", action=argparse.BooleanOptionalAction, default=None,
                   help="generation.DIRECT_STEP for the run (default: as it is)")
    p.add_argument("--mid-levels-in-kernel", action=argparse.BooleanOptionalAction, default=None,
                   help="generation.MID_LEVELS_IN_KERNEL for the run (default: as it is)")
    p.add_argument("--top", type=int, default=25, help="kernels listed")
    args = p.parse_args()
    b, c, length = (int(v) for v in args.shape.split("x"))
    if args.direct_step is not None:
        generation.DIRECT_STEP = args.direct_step
    if args.mid_levels_in_kernel is not None:
        generation.MID_LEVELS_IN_KERNEL = args.mid_levels_in_kernel
    torch.manual_seed(0)
    x = torch.randn(b, c, length, device="cuda")
    k = torch.randn(c, length, device="cuda") / length**0.5
    with torch.inference_mode():
        _, state = generation.prefill(x[..., :0], k, length, cuda_graph=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for t in range(length):
                generation.step(x[..., t], state)
            torch.cuda.synchronize()
        wall = time.perf_counter() - start
    times: dict[str, float] = collections.defaultdict(float)
    launches: collections.Counter[str] = collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name] += event.device_time
            launches[event.name] += 1
    total = sum(times.values())
    print(f"B{b} C{c} L{length}, DIRECT_STEP={generation.DIRECT_STEP}, MID_LEVELS_IN_KERNEL="
          f"{generation.MID_LEVELS_IN_KERNEL}: {wall:.3f} s under the profiler, kernels {total / 1e6:.3f} s = "
          f"{total / length:.2f} µs a token")
    for name, t in sorted(times.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {t / length:8.3f} µs/token  {launches[name]:7d} launches  {t / launches[name]:9.2f} µs each  {name[:100]}")


if __name__ == "__main__":
    main()
