"""The torch.fft (cuFFT on GPUs) path, in plain differentiable ATen ops.

It serves CPU tensors and the GPU calls that no kernel covers (other GPUs, float64, N < 256 or
N > 2^23, bidirectional filters) in fp32 (or float64) whatever the precision asked for: faster
than emulating the operand rounding, and at least as accurate. Its spectra are in rfft order,
(G, N/2 + 1) complex, one row per filter; autograd and torch.compile see ordinary ATen ops.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .planner import MonarchPlan, compute_dtype


def filter_spectrum(k: Tensor, plan: MonarchPlan) -> Tensor:
    """rfft of the zero-padded filters, (G, N/2 + 1) complex, with the inverse's 1/N folded in.

    k is (G, Lk), or (G, 2, Lk) for bidirectional filters: [:, 0] causal, [:, 1] anti-causal.
    The anti-causal tap k[g, 1, s] sits at lag -s, i.e. at index N - s of the N-point circle:
    the filter reversed around index 0, whose spectrum is the conjugate of its own."""
    spectrum = torch.fft.rfft(_as(k, compute_dtype(k)), n=plan.fft_size, norm="forward")
    if k.dim() == 3:
        spectrum = spectrum[:, 0] + spectrum[:, 1].conj_physical()
    return spectrum


def conv(u: Tensor, spectrum: Tensor, skip: Tensor | None, plan: MonarchPlan) -> Tensor:
    """y = conv(u, k) (+ skip·u) from k's `filter_spectrum`, in u's dtype. With G < C filter
    rows, channel c takes row c // (C // G)."""
    x = _as(u, torch.float64 if spectrum.dtype == torch.complex128 else torch.float32)
    product = torch.fft.rfft(x, n=plan.fft_size)
    groups, channels = spectrum.shape[0], u.shape[-2]
    if groups == channels:
        product = product * spectrum
    else:  # u's channels viewed as (G, C/G) against the G rows broadcast over each group: no copy
        product = (product.unflatten(-2, (groups, channels // groups)) * spectrum.unsqueeze(-2)).flatten(-3, -2)
    # The spectrum carries 1/N already: the inverse must not divide again.
    y = torch.fft.irfft(product, n=plan.fft_size, norm="forward")[..., : u.shape[-1]]
    if skip is not None:
        y = y + skip.to(y.dtype).unsqueeze(-1) * x
    return _as(y, u.dtype)


def _as(t: Tensor, dtype: torch.dtype) -> Tensor:
    """t in `dtype`. A no-op `.to()` still costs a dispatch (~1 µs), which on the CPU, where
    this path runs the same FFTs as the plain torch.fft model, is all the package adds."""
    return t if t.dtype == dtype else t.to(dtype)
