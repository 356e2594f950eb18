#!/usr/bin/env python
"""Where a graphed generation's GPU time goes: every token of an FFTConv-style stream (the
functional prefill/step, CUDA graphs) under torch.profiler, CUDA activity; kernel time by name,
per token, and the loop's wall time (under the profiler: longer than a plain run's).

    python benchmarks/generation_profile.py --shape 16x1024x65536
    python benchmarks/generation_profile.py --shape 1x256x8192 --direct-step   # generation.DIRECT_STEP on
    python benchmarks/generation_profile.py --shape 16x1024x65536 --host       # host time, no profiler

--host times the host instead: FFTConv.step in a streamed loop (no profiler, one synchronisation
at the end), then each piece of a direct step's host path in isolation (the op, a one-element
add_ as the floor of any PyTorch CUDA op, the checks, x[..., t]), then cProfile over a quarter of
the tokens. Session 25 (H200): 18.5 µs a token; the op 9.0, the floor 6.4.

Session 24 (H100, B16 C1024 L65536): 11.9 µs of kernels a token, of which the step kernel 3.65,
the copy of x_t 3.42 (two kernels: the example's x is a 4 GiB tensor, so TensorIterator splits the
copy of its (B, C) view for 64-bit offsets), the index increment 1.35.
"""
from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the checkout's package, where none is installed

from monarch_fftconv import generation


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="16x1024x65536", help="BxCxL: L tokens generated from an empty prompt")
    p.add_argument("--direct-step", action=argparse.BooleanOptionalAction, default=None,
                   help="generation.DIRECT_STEP for the run (default: as it is)")
    p.add_argument("--mid-levels-in-kernel", action=argparse.BooleanOptionalAction, default=None,
                   help="generation.MID_LEVELS_IN_KERNEL for the run (default: as it is)")
    p.add_argument("--direct-stepper", action=argparse.BooleanOptionalAction, default=None,
                   help="generation.DIRECT_STEPPER for the run (default: as it is; --host only: the layer's steps)")
    p.add_argument("--top", type=int, default=25, help="kernels (or, with --host, Python frames) listed")
    p.add_argument("--host", action="store_true", help="the host's time a token and its pieces, no profiler")
    args = p.parse_args()
    b, c, length = (int(v) for v in args.shape.split("x"))
    if args.direct_step is not None:
        generation.DIRECT_STEP = args.direct_step
    if args.mid_levels_in_kernel is not None:
        generation.MID_LEVELS_IN_KERNEL = args.mid_levels_in_kernel
    if args.direct_stepper is not None:
        generation.DIRECT_STEPPER = args.direct_stepper
    torch.manual_seed(0)
    if args.host:
        return host_time(b, c, length, args.top)
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


def host_time(b: int, c: int, length: int, top: int) -> None:
    """FFTConv.step's host time a token, streamed, and the pieces of a direct step's host path."""
    import cProfile
    import io
    import pstats
    import timeit

    from monarch_fftconv import FFTConv, ops

    layer = FFTConv(c, length, device="cuda")
    x = torch.randn(b, c, length, device="cuda")
    quarter = length // 4
    with torch.inference_mode():
        _, state = layer.prefill(x[..., :0], max_len=length, cuda_graph=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for t in range(quarter):
            layer.step(x[..., t], state)
        torch.cuda.synchronize()
        per_token = (time.perf_counter() - start) / quarter
        print(f"B{b} C{c} L{length}, DIRECT_STEP={generation.DIRECT_STEP}, DIRECT_STEPPER="
              f"{generation.DIRECT_STEPPER} (stepper made: {state.direct is not None}): {per_token * 1e6:.2f} µs a token "
              f"streamed (the first {quarter} tokens)")
        profiler = cProfile.Profile()
        profiler.enable()
        for t in range(quarter, 2 * quarter):
            layer.step(x[..., t], state)
        profiler.disable()
        torch.cuda.synchronize()
        graphed, x_t, position = state.graphed, x[..., 5], 2 * quarter + 2  # a position past the run's
        one = torch.zeros(1, device="cuda")
        pieces = {
            "ops.conv_step_at_op, no fold": lambda: ops.conv_step_at_op(
                x_t, state.inputs, state.pending, graphed.outputs, state.first_tap, state.second_tap, graphed.index,
                position, False, None),
        }
        if state.direct is not None:  # the stepper's rows only where the prefill made one
            pieces["the DirectStepper's step (level 0's fold)"] = lambda: state.direct.step(x_t, position, layer.filter)
            pieces["FFTConv.step through the stepper (no fold)"] = lambda: _last_token(layer, x_t, state, length)
        pieces |= {
            "a one-element add_ (any CUDA op's floor)": lambda: one.add_(1),
            "torch.empty(B, C)": lambda: torch.empty(b, c, device="cuda"),
            "x[..., t]": lambda: x[..., 17],
            "the filter watch": lambda: state.watch.check([layer.filter], "filter"),
            "generation._check_step": lambda: generation._check_step(x_t, state),
        }
        print("host µs a call, streamed (best of 3 runs of 5000):")
        for name, call in pieces.items():
            torch.cuda.synchronize()
            micros = min(timeit.repeat(call, number=5000, repeat=3)) / 5000 * 1e6
            print(f"  {name:44s} {micros:7.2f}")
        torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    print(f"== cProfile, tokens {quarter} .. {2 * quarter - 1}\n{out.getvalue()}")


def _last_token(layer, x_t, state, length: int):
    """FFTConv.step at the last position (no fold) over and over: the layer's whole call."""
    state.position = length - 1
    return layer.step(x_t, state)


if __name__ == "__main__":
    main()
