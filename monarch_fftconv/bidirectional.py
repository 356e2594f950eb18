"""Bidirectional filters on the Monarch ops and kernels (issue #39).

A bidirectional filter, in the "fftconv_ref" convention (functional.py names both), puts causal
tap s at lag s and anti-causal tap s at lag -s:

    y[t] = sum_s k_fwd[s] u[t - s] + sum_s k_rev[s] u[t + s]

On the ops' N-point circle (N >= 2L, u zero-padded) lag -s is bin N - s, and no lag of either
half wraps onto the other's outputs. For real taps the DFT of the reversed half is the conjugate
of its own DFT, bin by bin, so the whole filter's spectrum is

    K_bi[f] = K_fwd[f] + conj(K_rev[f])

in any layout that stores a value per frequency, which the ops' layouts do (the radix and four-step
spectra are float64 torch.fft's bins, in their order: tests/test_cuda.py). It is also the spectrum
of one real sequence, the N-point circle with k_fwd[s] at bin s and k_rev[s] at bin N - s, which
the CUDA spectrum kernel transforms in one launch (ops.filter_spectrum_two_sided). The forward is
then the causal call's: one conv launch on K_bi, with D fused as usual.

The backward, from the same ops:
- du = IFFT(DY conj K_bi), the causal backward's du given K_bi;
- dk_fwd[s] = sum_b sum_t dy[t] u[t - s] and dD, the causal backward's dk and dskip (they do not
  depend on the spectrum);
- dk_rev[s] = sum_b sum_t dy[t] u[t + s]: lag -s of the same correlation, which the backward's
  N-point circle holds at bin N - s (nothing wraps: N >= 2L). The two-sided backward op stores
  both lag signs of it as dk (C, 2, Lk), so one backward serves the whole filter. (Session 16 ran
  a second backward on the time-reversed dy and u for it: 2.83 ms fwd+bwd at 16x256x8192 on an
  H100, against 1.16 for a causal filter.)

The "m2" convention (anti-causal tap s at lag -(s+1)) is turned into this one before the call
(functional._m2_as_fftconv_ref), and its gradient follows through that shift's autograd.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import ops


class BidirectionalConv(torch.autograd.Function):
    """y = conv(u, k_bi) (+ skip u) on the ops, k a (C, 2, Lk) filter bank (one row per channel:
    the caller repeats grouped rows, and their gradient sums through that repeat)."""

    @staticmethod
    def forward(u: Tensor, k: Tensor, skip: Tensor | None, precision: str) -> Tensor:
        return ops.conv_forward_op(u, ops.filter_spectrum_two_sided_op(k, u.shape[-1], precision), skip, precision)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        u, k, skip, precision = inputs
        # The spectrum is recomputed in the backward (one filter-bank FFT, C rows): saving it
        # would hold C x N complex values between the passes.
        ctx.save_for_backward(u, k, skip)
        ctx.precision = precision

    @staticmethod
    def backward(ctx, grad: Tensor):
        u, k, skip = ctx.saved_tensors
        needs_u, needs_k, needs_skip, _ = ctx.needs_input_grad
        precision, taps = ctx.precision, k.shape[-1]
        spectrum = ops.filter_spectrum_two_sided_op(k, u.shape[-1], precision)
        backward = ops.fftconv_backward_two_sided_op if needs_k else ops.fftconv_backward_op
        du, dk, dskip = backward(grad.contiguous(), u, spectrum, skip, taps, precision)
        return (
            du.to(u.dtype) if needs_u else None,
            dk.to(k.dtype) if needs_k else None,
            dskip.to(skip.dtype) if needs_skip else None,
            None,
        )
