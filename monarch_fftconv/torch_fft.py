"""The torch.fft (cuFFT on GPUs) path, in plain differentiable ATen ops.

It serves CPU tensors and the GPU calls that no kernel covers (other GPUs, float64, N < 256 or
N > 2^23, bidirectional filters) in fp32 (or float64) whatever the precision asked for: faster
than emulating the operand rounding, and at least as accurate. Its spectra are in rfft order,
(G, N/2 + 1) complex, one row per filter; autograd and torch.compile see ordinary ATen ops.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd import forward_ad

from .planner import MonarchPlan


def filter_spectrum(k: Tensor, plan: MonarchPlan) -> Tensor:
    """rfft of the zero-padded filters, (G, N/2 + 1) complex: the plain model's `rfft(k, n=N)`.

    k is (G, Lk), or (G, 2, Lk) for bidirectional filters: [:, 0] causal, [:, 1] anti-causal.
    The anti-causal tap k[g, 1, s] sits at lag -s, i.e. at index N - s of the N-point circle:
    the filter reversed around index 0, whose spectrum is the conjugate of its own."""
    return _spectrum(k, plan.fft_size)


def fftconv(u: Tensor, k: Tensor, skip: Tensor | None, fft_size: int) -> Tensor:
    """conv(u, k) (+ skip·u) with the FFT size given: `conv(u, filter_spectrum(k))`, and while
    autograd records a causal call, `_CausalConv` (the same forward, a cheaper backward)."""
    if k.dim() == 2 and torch.is_grad_enabled() and (u.requires_grad or k.requires_grad) and not in_transform():
        fft_dtype = _fft_dtype(k)
        x = _as(u, fft_dtype)
        return _finish(_CausalConv.apply(x, _as(k, fft_dtype), fft_size), skip, x, u.dtype)
    return _conv(u, _spectrum(k, fft_size), skip, fft_size)


def conv(u: Tensor, spectrum: Tensor, skip: Tensor | None, plan: MonarchPlan) -> Tensor:
    """y = conv(u, k) (+ skip·u) from k's `filter_spectrum`, in u's dtype. With G < C filter
    rows, channel c takes row c // (C // G)."""
    return _conv(u, spectrum, skip, plan.fft_size)


def in_transform() -> bool:
    """Inside forward-mode AD (autograd's dual level) or a functorch transform (torch.func's
    jvp, grad, vmap, ...; their levels are one stack): there the convolution is plain ATen ops
    all through, whose every transform PyTorch defines (`_CausalConv` and the package's ops
    have a backward alone). Not while torch.compile traces."""
    if torch.compiler.is_compiling():
        return False
    return forward_ad._current_level >= 0 or torch._C._functorch.maybe_current_level() is not None


# The same ATen calls as the plain torch.fft model and nothing more: rfft's n= pads inside the
# transform (no explicit pad), default norms (the inverse divides by N), no no-op casts.
def _spectrum(k: Tensor, n: int) -> Tensor:
    spectrum = torch.fft.rfft(_as(k, _fft_dtype(k)), n=n)
    if k.dim() == 3:
        spectrum = spectrum[:, 0] + spectrum[:, 1].conj_physical()
    return spectrum


def _conv(u: Tensor, spectrum: Tensor, skip: Tensor | None, n: int) -> Tensor:
    x = _as(u, torch.float64 if spectrum.dtype == torch.complex128 else torch.float32)
    product = torch.fft.rfft(x, n=n)
    # In place where autograd records neither operand: one (B, C, N/2 + 1) allocation fewer. Not
    # inside a functorch transform: vmap over the filter alone cannot write a batched product
    # into the unbatched one.
    in_place = not (product.requires_grad or spectrum.requires_grad or in_transform())
    y = torch.fft.irfft(_times(product, spectrum, in_place), n=n)
    return _finish(y[..., : u.shape[-1]], skip, x, u.dtype)


def _finish(y: Tensor, skip: Tensor | None, x: Tensor, dtype: torch.dtype) -> Tensor:
    """y (+ skip·x, the skip term on the input as transformed), in the caller's dtype."""
    if skip is not None:
        y = y + skip.to(y.dtype).unsqueeze(-1) * x
    return _as(y, dtype)


def _fft_dtype(t: Tensor) -> torch.dtype:
    """What the FFTs of t compute in: float64 stays, everything else (half inputs) float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _as(t: Tensor, dtype: torch.dtype) -> Tensor:
    return t if t.dtype == dtype else t.to(dtype)  # a no-op .to() still costs a dispatch


def _times(spectra: Tensor, rows: Tensor, in_place: bool) -> Tensor:
    """spectra (..., C, F) times the G filter rows (G, F), channel c taking row c // (C // G)."""
    groups, channels = rows.shape[0], spectra.shape[-2]
    if groups != channels:  # the channels viewed as (G, C/G) against each row broadcast: no copy
        grouped = spectra.unflatten(-2, (groups, channels // groups))
        rows = rows.unsqueeze(-2)
        return (grouped.mul_(rows) if in_place else grouped * rows).flatten(-3, -2)
    return spectra.mul_(rows) if in_place else spectra * rows


class _CausalConv(torch.autograd.Function):
    """y = irfft(rfft(x, n) · rfft(k, n), n)[..., :L] for x (B, C, L) and a causal filter bank
    k (G, Lk) of x's dtype: the plain model's forward, with its backward written out. Autograd
    through the plain ops differentiates each rfft by a zero-filled complex inverse FFT of all
    N points; here, with G = rfft(g, n), each gradient is a real inverse of half the work:
        grad_x = irfft(G · conj(K), n)[..., :L]     (correlation of g with k)
        grad_k = irfft(Σ_b G · conj(X), n)[..., :Lk]  (with x; summed over each group)
    The spectra saved are the plain model's (those its product saves). The gradients carry no
    graph of their own: a double backward (create_graph=True) is refused, as on CUDA."""

    @staticmethod
    def forward(ctx, x: Tensor, k: Tensor, n: int) -> Tensor:
        x_f, k_f = torch.fft.rfft(x, n=n), torch.fft.rfft(k, n=n)
        ctx.save_for_backward(x_f, k_f)
        ctx.n, ctx.length, ctx.taps = n, x.shape[-1], k.shape[-1]
        return torch.fft.irfft(_times(x_f, k_f, in_place=False), n=n)[..., : x.shape[-1]]

    @staticmethod
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        if torch.is_grad_enabled():
            raise RuntimeError("fftconv: double backward (create_graph=True) is not supported on the torch.fft "
                               "path, as on the CUDA kernels: its backward is computed, not recorded")
        x_f, k_f = ctx.saved_tensors
        n = ctx.n
        g_f = torch.fft.rfft(grad_y, n=n)
        grad_x = grad_k = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.fft.irfft(_times(g_f, k_f.conj_physical(), in_place=False), n=n)[..., : ctx.length]
        if ctx.needs_input_grad[1]:
            # Σ_b conj(G)·X = conj(Σ_b G·conj(X)), conjugating g's spectrum in place rather than
            # x's saved one; a conjugate spectrum's inverse is the time reversal t -> N - t.
            per_channel = (g_f.conj_physical_() * x_f).sum(0)
            groups = k_f.shape[0]
            if groups != per_channel.shape[0]:
                per_channel = per_channel.unflatten(0, (groups, -1)).sum(1)
            reversed_ = torch.fft.irfft(per_channel, n=n)
            grad_k = torch.cat([reversed_[:, :1], reversed_[:, n - ctx.taps + 1:].flip(-1)], dim=-1)
        return grad_x, grad_k, None
