"""The torch.fft (cuFFT on GPUs) path, in plain differentiable ATen ops.

It serves CPU tensors and the GPU calls that no kernel covers (other GPUs, float64, N < 256 or
N > 2^23) in fp32 (or float64) whatever the precision asked for: faster than emulating the operand rounding, and
at least as accurate. Its spectra are in rfft order, (C, N/2 + 1) complex; autograd and
torch.compile see ordinary ATen ops.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .planner import MonarchPlan, compute_dtype


def filter_spectrum(k: Tensor, plan: MonarchPlan) -> Tensor:
    """rfft of the zero-padded filter, (C, N/2 + 1) complex, with the inverse's 1/N folded in."""
    return torch.fft.rfft(k.to(compute_dtype(k)), n=plan.fft_size, norm="forward")


def conv(u: Tensor, spectrum: Tensor, skip: Tensor | None, plan: MonarchPlan) -> Tensor:
    """y = causal_conv(u, k) (+ skip·u) from k's `filter_spectrum`, in u's dtype."""
    x = u.to(torch.float64 if spectrum.dtype == torch.complex128 else torch.float32)
    # The spectrum carries 1/N already: the inverse must not divide again.
    y = torch.fft.irfft(torch.fft.rfft(x, n=plan.fft_size) * spectrum, n=plan.fft_size, norm="forward")
    y = y[..., : u.shape[-1]]
    if skip is not None:
        y = y + skip.to(y.dtype).unsqueeze(-1) * x
    return y.to(u.dtype)

