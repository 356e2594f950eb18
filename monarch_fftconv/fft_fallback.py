"""The always-correct path: torch.fft (cuFFT on GPUs) on the Monarch-layout spectrum.

Used for precision "fp32" where no fused kernel covers the call (other GPUs, float64
inputs, lengths beyond the kernels), and for the filter gradient on GPUs.
"""

from __future__ import annotations

import functools

import torch

from .planner import MonarchPlan, compute_dtype, spectrum_frequencies


@functools.lru_cache(maxsize=None)
def _indices(plan: MonarchPlan, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Index tensors on `device`, built once per (plan, device). Every FFT bin f of a real
    signal is stored either as itself or, for f > N/2, as the conjugate of rfft bin N - f.
    - stored_bin (R, M): the rfft bin that each stored entry comes from;
    - stored_sign (R, M, 2): (1/N, ±1/N) — the conjugation of those entries and the 1/N scale;
    - rfft_source (N/2+1,): for each rfft bin, the flat stored position holding f or N - f;
    - rfft_conj (N/2+1,): whether that position holds N - f (so it must be conjugated)."""
    frequency = spectrum_frequencies(plan)
    n = plan.fft_size
    mirrored = frequency > n // 2
    stored_bin = torch.where(mirrored, n - frequency, frequency)
    stored_sign = torch.stack([torch.ones_like(frequency), 1 - 2 * mirrored.long()], dim=-1).double() / n
    flat = frequency.flatten()
    position = torch.full((n,), -1, dtype=torch.long)
    position[flat] = torch.arange(flat.numel())
    bins = torch.arange(n // 2 + 1)
    direct = position[bins]
    rfft_conj = direct < 0
    rfft_source = torch.where(rfft_conj, position[(n - bins) % n], direct)
    assert bool((rfft_source >= 0).all()), "the stored half spectrum must cover every rfft bin"
    return stored_bin.to(device), stored_sign.to(device), rfft_source.to(device), rfft_conj.to(device)


def monarch_to_rfft(spectrum: torch.Tensor, plan: MonarchPlan) -> torch.Tensor:
    """(..., R, M) Monarch-layout half spectrum -> (..., N/2+1) rfft order."""
    _, _, source, conj = _indices(plan, spectrum.device)
    values = spectrum.flatten(-2)[..., source]
    return torch.where(conj, values.conj_physical(), values)


def filter_spectrum(k: torch.Tensor, plan: MonarchPlan) -> torch.Tensor:
    """(C, R, M) Monarch-layout spectrum / N of the zero-padded filter: one rfft, one gather,
    one multiply (conjugation of the mirrored bins and the 1/N scale together)."""
    dtype = compute_dtype(k)
    stored_bin, stored_sign, _, _ = _indices(plan, k.device)
    gathered = torch.view_as_real(torch.fft.rfft(k.to(dtype), n=plan.fft_size)[..., stored_bin])
    return torch.view_as_complex(gathered * stored_sign.to(dtype))


def conv_forward(u: torch.Tensor, spectrum: torch.Tensor, skip: torch.Tensor | None, plan: MonarchPlan) -> torch.Tensor:
    length = u.shape[-1]
    x = u.to(spectrum.real.dtype)
    # The stored spectrum carries 1/N already: the inverse must not divide again.
    y = torch.fft.irfft(torch.fft.rfft(x, n=plan.fft_size) * monarch_to_rfft(spectrum, plan), n=plan.fft_size, norm="forward")
    y = y[..., :length].contiguous()
    if skip is not None:
        y = y + skip.to(y.dtype).unsqueeze(-1) * x
    return y.to(u.dtype)


def filter_grad(grad: torch.Tensor, u: torch.Tensor, filter_len: int, plan: MonarchPlan) -> torch.Tensor:
    """dk[c, j] = Σ_b Σ_t g[b,c,t]·u[b,c,t-j], as an FFT correlation."""
    dtype = compute_dtype(grad, u)
    g = torch.fft.rfft(grad.to(dtype), n=plan.fft_size)
    x = torch.fft.rfft(u.to(dtype), n=plan.fft_size)
    return torch.fft.irfft((g * x.conj_physical()).sum(0), n=plan.fft_size)[..., :filter_len].contiguous()
