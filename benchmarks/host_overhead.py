#!/usr/bin/env python
"""Host (CPU) time per call, the GPU idle: what a call costs the Python thread that makes it.

    python benchmarks/host_overhead.py                     # 1x8x1024 and 16x256x8192, all paths
    python benchmarks/host_overhead.py --shapes 3x5x1000 --profile
    python benchmarks/host_overhead.py --device cpu       # the CPU path against the plain model

CPU (--device cpu, one torch thread): the package and the plain torch.fft model (`reference`
below, the same FFTs) are timed interleaved, call for call in alternating order, so that the
host's noise (2 shared cores) falls on both alike. Per shape and pass: each one's median µs per
call and ratio = reference / package (> 1: the package is faster). Then the host time the
package adds per call: blocks of --block calls each, interleaved, package block minus
reference block, the median over --reps blocks, at --host-shape.

For each call: torch.cuda.synchronize(), then time.perf_counter() around the call alone (no
synchronize inside the timed region). With nothing queued the GPU is idle, so the figure is
the host's own cost: input checks, dispatch, autograd bookkeeping and kernel launches. A
training step is `y = f(u); y.backward(g)`: its figure includes the backward's host work,
which autograd runs on its device thread while this one waits. Medians over --reps calls.

Targets of the issue "Training steps faster than torch.fft at every length": at most 25 µs per
forward and 60 µs per training step. The "floor" rows time `u * k` (broadcast over the batch,
one ATen kernel forward and two in its backward) the same way: what PyTorch's dispatcher and
autograd engine cost a step of the simplest differentiable op on this host.
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the checkout's package, where none is installed

import monarch_fftconv as mf


def host_microseconds(call, reps: int) -> float:
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def reference(u, k):
    n = 2 * u.shape[-1]
    return torch.fft.irfft(torch.fft.rfft(u, n=n) * torch.fft.rfft(k, n=n), n=n)[..., : u.shape[-1]]


def calls(shape, precision):
    b, c, length = shape
    u = torch.randn(b, c, length, device="cuda")
    k = torch.randn(c, length, device="cuda") / length
    ug, kg = u.clone().requires_grad_(), k.clone().requires_grad_()
    g = torch.randn_like(u)
    layer = mf.FFTConv(c, length, precision=precision, device="cuda")
    served = mf.FFTConv(c, length, precision=precision, device="cuda")
    # One inference_cache() block over every rep (`served` is never written), kept open by the
    # call that uses it: a collected block would close and drop the cache.
    serving = contextlib.ExitStack()
    serving.enter_context(mf.inference_cache(served))

    def step(f, *args):
        def run():
            f(*args).backward(g)
        return run

    def no_grad(f, *args):
        def run():
            with torch.no_grad():
                f(*args)
        return run

    def conv(u_, k_):
        return mf.fftconv(u_, k_, precision=precision)

    def elementwise(u_, k_):  # one ATen kernel each way: autograd's own floor for a step
        return u_ * k_

    return {
        "floor: u*k fwd (no grad)": no_grad(elementwise, u, k),
        "floor: u*k train step": step(elementwise, ug, kg),
        "reference fwd": no_grad(reference, u, k),
        "fftconv fwd (no grad)": no_grad(conv, u, k),
        "fftconv fwd (grad)": lambda: conv(ug, kg),
        "FFTConv fwd (no grad)": no_grad(layer, u),
        "FFTConv fwd (no grad, inference_cache)": no_grad(lambda x, _block=serving: served(x), u),
        "reference train step": step(reference, ug, kg),
        "fftconv train step": step(conv, ug, kg),
        "FFTConv train step": step(layer, ug),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--shapes", default=None,
                   help="BxCxL,... (default: 1x8x1024,16x256x8192 on cuda; " + CPU_SHAPES + " on cpu)")
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--block", type=int, default=50, help="cpu: calls per block of the host-time row")
    p.add_argument("--host-shape", default="1x4x256", help="cpu: the shape of the host-time row")
    p.add_argument("--profile", action="store_true",
                   help="cProfile and torch.profiler: the fftconv forward (grad), the training step and "
                        "FFTConv inside inference_cache(), at the first shape")
    args = p.parse_args()
    if args.device == "cpu":
        return cpu_main(args)
    args.shapes = args.shapes or "1x8x1024,16x256x8192"
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    print(f"host µs per call, GPU idle, median of {args.reps} ({torch.cuda.get_device_name()}, torch {torch.__version__})")
    for shape in shapes:
        for precision in args.precisions.split(","):
            results = {name: host_microseconds(call, args.reps) for name, call in calls(shape, precision).items()}
            backend = mf.explain(*make_probe(shape), precision=precision)["backend"]
            print(f"-- {'x'.join(map(str, shape))} {precision}: {backend}")
            for name, micros in results.items():
                print(f"   {name:32s} {micros:8.1f} µs")
    if args.profile:
        profile(calls(shapes[0], args.precisions.split(",")[0]))


def profile(named_calls) -> None:
    """Where the host time goes: cProfile (the Python frames) and torch.profiler (the ops,
    the C++ side) over 200 calls of the forward with autograd, of the training step and of the
    cached module call (session 25 found its refresh op's custom_op layers there: 31 µs a call)."""
    for name in ("fftconv fwd (grad)", "fftconv train step", "FFTConv fwd (no grad, inference_cache)"):
        call = named_calls[name]
        for _ in range(20):
            call()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            call()
        prof.disable()
        torch.cuda.synchronize()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
        print(f"== cProfile, 200 x {name}\n{out.getvalue()}")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as tprof:
            for _ in range(200):
                call()
            torch.cuda.synchronize()
        print(f"== torch.profiler, 200 x {name}")
        print(tprof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


CPU_SHAPES = "1x4x256,4x8x1024,4x64x4096,2x16x8192"


def cpu_calls(shape):
    """{pass: (reference call, package call, ...)} on the same inputs: the forward under
    no_grad and recording a graph, and the training step y.backward(g); for fftconv and FFTConv
    (against the plain model on its filter)."""
    b, c, length = shape
    u = torch.randn(b, c, length)
    layer = mf.FFTConv(c, length)
    with torch.no_grad():
        layer.filter.div_(length ** 0.5)
    k = layer.filter.detach().clone()
    ug, kg = u.clone().requires_grad_(), k.clone().requires_grad_()
    g = torch.randn_like(u)

    def no_grad(f, *args):
        def run():
            with torch.no_grad():
                return f(*args)
        return run

    def step(f, *args):
        def run():
            f(*args).backward(g)
        return run

    def module_reference(x):
        return reference(x, layer.filter)

    return {
        "fftconv fwd (no_grad)": (no_grad(reference, u, k), no_grad(mf.fftconv, u, k)),
        "fftconv fwd (grad)": (lambda: reference(ug, kg), lambda: mf.fftconv(ug, kg)),
        "fftconv fwd+bwd": (step(reference, ug, kg), step(mf.fftconv, ug, kg)),
        "FFTConv fwd (no_grad)": (no_grad(module_reference, u), no_grad(layer, u)),
        "FFTConv fwd+bwd": (step(module_reference, ug), step(layer, ug)),
    }


def interleaved_seconds(pair, reps: int, block: int = 1) -> tuple[float, float]:
    """Median seconds per call of each of (reference, package), timed in blocks of `block` calls
    in alternating order (ref, pkg, pkg, ref, ...) after a warm-up of both."""
    for _ in range(max(20, reps // 10)):
        for call in pair:
            call()
    times: tuple[list, list] = ([], [])
    for rep in range(reps):
        for which in ((0, 1) if rep % 2 == 0 else (1, 0)):
            call = pair[which]
            t0 = time.perf_counter()
            for _ in range(block):
                call()
            times[which].append((time.perf_counter() - t0) / block)
    return statistics.median(times[0]), statistics.median(times[1])


def cpu_main(args) -> None:
    torch.set_num_threads(1)
    shapes = [tuple(int(x) for x in s.split("x")) for s in (args.shapes or CPU_SHAPES).split(",")]
    print(f"CPU, one torch thread, torch {torch.__version__}; medians of {args.reps} interleaved calls; "
          f"ratio = reference / package (> 1: the package is faster)")
    print(f"{'shape':>10s}  {'pass':24s} {'reference µs':>13s} {'package µs':>11s} {'ratio':>6s}")
    for shape in shapes:
        for name, pair in cpu_calls(shape).items():
            ref, pkg = interleaved_seconds(pair, args.reps)
            print(f"{'x'.join(map(str, shape)):>10s}  {name:24s} {ref * 1e6:13.1f} {pkg * 1e6:11.1f} {ref / pkg:6.3f}")
    host_shape = tuple(int(x) for x in args.host_shape.split("x"))
    print(f"host time the package adds per call at {args.host_shape}, µs (blocks of {args.block} calls, "
          f"median of {args.reps} interleaved blocks):")
    for name, pair in cpu_calls(host_shape).items():
        ref, pkg = interleaved_seconds(pair, args.reps, args.block)
        print(f"   {name:24s} {(pkg - ref) * 1e6:+6.2f}  (reference {ref * 1e6:.1f}, package {pkg * 1e6:.1f})")


def make_probe(shape):
    b, c, length = shape
    return torch.empty(b, c, length, device="cuda"), torch.empty(c, length, device="cuda")


if __name__ == "__main__":
    main()
