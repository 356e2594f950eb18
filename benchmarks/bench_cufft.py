#!/usr/bin/env python
"""Benchmark monarch_fftconv against torch.fft (cuFFT on a GPU): the command-line entry point.

    python benchmarks/bench_cufft.py                       # reference workload 16x256x8192, fp32 I/O
    python benchmarks/bench_cufft.py --backward            # forward+backward (grads w.r.t. u and k)
    python benchmarks/bench_cufft.py --io-dtype bfloat16   # bf16 u, k, y (torch.fft: via float32)
    python benchmarks/bench_cufft.py --operator gated      # issue #30: gated, grouped, bidirectional
    python benchmarks/bench_cufft.py --preset flashfftconv --operator gated --io-dtype float16
    python benchmarks/bench_cufft.py --methods reference,monarch[fp32],cudnn   # the cuDNN peer
        # (needs cuDNN >= 9.26: pip install nvidia-cudnn-cu13 nvidia-cudnn-frontend; else skipped)
    python benchmarks/bench_cufft.py --preset lengths      # B=16, C=256, L = 1024 ... 16384
    python benchmarks/bench_cufft.py --shapes 16x256x8192,16x256x1024 --compile --energy
    python benchmarks/bench_cufft.py --quick --device cpu  # tiny CPU smoke run (used by the tests)

The benchmark itself is the package benchmarks/fftconv_bench (methods, timing, validity guard,
report, outputs, plots); `--help` describes the methods and how they are timed and checked.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:   # run as a script, sys.path[0] is already here; imported, maybe not
    sys.path.insert(0, _HERE)

from fftconv_bench.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
