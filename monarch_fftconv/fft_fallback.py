"""The always-correct path: torch.fft (cuFFT on GPUs) on the Monarch-layout spectrum.

Used for precision "fp32" where no fused kernel covers the call (other GPUs, float64
inputs, lengths beyond the kernels), and for the filter gradient on GPUs.
"""

from __future__ import annotations

import functools

import torch

from .planner import MonarchPlan, spectrum_frequencies


@functools.lru_cache(maxsize=None)
def _rfft_gather(plan: MonarchPlan) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For each rfft bin f in [0, N/2]: the flat index into the stored half spectrum that
    holds f or N - f, and whether it must be conjugated. Also the inverse map (stored
    position -> rfft bin) used to build a Monarch-layout spectrum from an rfft."""
    freqs = spectrum_frequencies(plan).flatten()  # frequency held by each stored entry
    n = plan.fft_size
    position = torch.full((n,), -1, dtype=torch.long)
    position[freqs] = torch.arange(freqs.numel())
    bins = torch.arange(n // 2 + 1)
    direct = position[bins]
    mirrored = position[(n - bins) % n]
    conj = direct < 0  # not stored: use the Hermitian partner N - f
    index = torch.where(conj, mirrored, direct)
    assert bool((index >= 0).all()), "the stored half spectrum must cover every rfft bin"
    stored_bin = torch.where(freqs <= n // 2, freqs, n - freqs)
    return index, conj, stored_bin


def monarch_to_rfft(spectrum: torch.Tensor, plan: MonarchPlan) -> torch.Tensor:
    """(..., R, M) Monarch-layout half spectrum -> (..., N/2+1) rfft order."""
    index, conj, _ = _rfft_gather(plan)
    flat = spectrum.flatten(-2)[..., index.to(spectrum.device)]
    return torch.where(conj.to(spectrum.device), flat.conj_physical(), flat)


def rfft_to_monarch(rfft: torch.Tensor, plan: MonarchPlan) -> torch.Tensor:
    """(..., N/2+1) rfft order -> (..., R, M) Monarch layout (the inverse of monarch_to_rfft)."""
    _, _, stored_bin = _rfft_gather(plan)
    freqs = spectrum_frequencies(plan).flatten().to(rfft.device)
    values = rfft[..., stored_bin.to(rfft.device)]
    values = torch.where(freqs <= plan.fft_size // 2, values, values.conj_physical())
    return values.unflatten(-1, plan.spectrum_shape)


def filter_spectrum(k: torch.Tensor, plan: MonarchPlan) -> torch.Tensor:
    dtype = torch.float64 if k.dtype == torch.float64 else torch.float32
    return rfft_to_monarch(torch.fft.rfft(k.to(dtype), n=plan.fft_size) / plan.fft_size, plan)


def conv_forward(u: torch.Tensor, spectrum: torch.Tensor, skip: torch.Tensor | None, plan: MonarchPlan) -> torch.Tensor:
    length = u.shape[-1]
    x = u.to(spectrum.real.dtype)
    # The stored spectrum carries 1/N; irfft divides by N again ("forward" norm undoes that).
    y = torch.fft.irfft(torch.fft.rfft(x, n=plan.fft_size) * monarch_to_rfft(spectrum, plan), n=plan.fft_size, norm="forward")
    y = y[..., :length].contiguous()
    if skip is not None:
        y = y + skip.to(y.dtype).unsqueeze(-1) * x
    return y.to(u.dtype)


def filter_grad(grad: torch.Tensor, u: torch.Tensor, filter_len: int, plan: MonarchPlan) -> torch.Tensor:
    """dk[c, j] = Σ_b Σ_t g[b,c,t]·u[b,c,t-j], as an FFT correlation."""
    dtype = torch.float64 if torch.float64 in (grad.dtype, u.dtype) else torch.float32
    g = torch.fft.rfft(grad.to(dtype), n=plan.fft_size)
    x = torch.fft.rfft(u.to(dtype), n=plan.fft_size)
    return torch.fft.irfft((g * x.conj_physical()).sum(0), n=plan.fft_size)[..., :filter_len].contiguous()
