"""Long sequences, N = 2·next_pow2(L) > 32768: the four-step algorithm.

One N-point FFT does not fit on chip, so it is cut in two, N = P·M: time t = m + M·p, frequency
f = P·k1 + k2. A P-point DFT down each column m (the outer stage, with the twiddles
W_N^(m·k2)) leaves rows k2 of M values, whose M-point FFTs are the spectrum in the order
X[k2][k1] = FFT_N(x)[P·k1 + k2]. The filter product and the inverse transforms run on those
rows, and the outer stage's inverse gives y. x is real: only the rows k2 = 0 .. P/2 are kept
(the others are their conjugates), and only the first half of the columns holds data (the
zero padding). docs/design.md derives it; csrc/fftconv_fourstep.cu runs it on the GPU.

Two ops, with their CPU implementations here (the same algorithm in torch.fft, the spec the
kernels are tested against), fake kernels and autograd:

==============================================================  =============================
``fourstep_conv(x, S, conjugate) -> y``                         y = x convolved with the filter
                                                                whose four-step spectrum is S
                                                                (correlated, when conjugate)
``fourstep_spectrum(x, fft_size, inner_size, scale) -> X``      x's spectrum·scale, rows k2 <= P/2
==============================================================  =============================

S is (C, P/2+1, M, 2) real (a complex view), scaled by 1/N, with any skip term folded in.

The CPU code conjugates with conj_physical, never with lazy conjugate views: a product with a
conjugate view came out unconjugated when AOTAutograd ran the op (torch 2.13, CPU; the ops'
opcheck test catches it).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .planner import compute_dtype

MIN_FFT_SIZE = 65536  # below, the fused radix kernels hold the whole FFT on chip
MAX_FFT_SIZE = 1 << 23  # L = 4M


def inner_for(fft_size: int) -> int:
    """M, the inner FFT on chip, as the CUDA kernels split N (fftconv.h fourstep_inner_size):
    8192, except at N = 2^19, whose outer size would be 64 (the outer DFT runs in registers
    for P <= 32 and in shared memory for P >= 128): there 4096."""
    return 4096 if fft_size == 1 << 19 else 8192


def outer_size(fft_size: int, inner: int | None = None) -> int:
    return fft_size // (inner or inner_for(fft_size))


def spectrum_rows(fft_size: int, inner: int | None = None) -> int:
    """Rows k2 = 0 .. P/2 of the spectrum that are stored."""
    return outer_size(fft_size, inner) // 2 + 1


def spectrum_fft_size(spectrum: Tensor) -> int:
    """N of a four-step spectrum, (..., P/2+1, M) complex or (..., P/2+1, M, 2) real: 2·(P/2)·M."""
    rows, inner_size = spectrum.shape[-2:] if spectrum.is_complex() else spectrum.shape[-3:-1]
    return 2 * (rows - 1) * inner_size


def _row_weights(fft_size: int, inner_size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(P/2+1, 1): how often each stored row occurs in the full spectrum: rows 0 and P/2 once,
    the others twice (as themselves and as the conjugate row P - k2)."""
    weights = torch.full((spectrum_rows(fft_size, inner_size), 1), 2.0, dtype=dtype)
    weights[0] = weights[-1] = 1.0
    return weights.to(device)


def _twiddles(fft_size: int, inner_size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(P/2+1, M) complex: W_N^(m·k2) = exp(-2πi·m·k2/N), the exponent reduced exactly."""
    rows = spectrum_rows(fft_size, inner_size)
    exponent = (torch.arange(rows).unsqueeze(1) * torch.arange(inner_size).unsqueeze(0)) % fft_size
    angle = exponent.to(torch.float64) * (-2 * math.pi / fft_size)
    return torch.polar(torch.ones_like(angle), angle).to(dtype=dtype, device=device)


def _adjoint_twiddles(fft_size: int, inner_size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """conj(W_N^(m·k2)) / weight(k2): the spectrum's adjoint (see _spectrum_backward)."""
    real = torch.float64 if dtype == torch.complex128 else torch.float32
    return _twiddles(fft_size, inner_size, dtype, device).conj_physical() / _row_weights(fft_size, inner_size, real, device)


@functools.lru_cache(maxsize=64)  # a few MB each at most; the backward asks for them every step
def _cached(make, fft_size: int, inner_size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    return make(fft_size, inner_size, dtype, device)


def _table(make, fft_size: int, inner_size: int, like: Tensor, dtype: torch.dtype) -> Tensor:
    """A constant table on `like`'s device: cached for eager tensors, built afresh while
    torch.compile traces (its fake tensors must never meet a cached real one)."""
    if type(like) is torch.Tensor and not torch.compiler.is_compiling():
        return _cached(make, fft_size, inner_size, dtype, like.device)
    return make(fft_size, inner_size, dtype, like.device)


def twiddles(fft_size: int, inner_size: int, like: Tensor) -> Tensor:
    return _table(_twiddles, fft_size, inner_size, like, like.dtype)


def row_weights(fft_size: int, inner_size: int, like: Tensor) -> Tensor:
    return _table(_row_weights, fft_size, inner_size, like, like.real.dtype)


def _columns(x: Tensor, fft_size: int, inner_size: int) -> Tensor:
    """x zero-padded to N/2 and viewed as (..., P/2, M): row p holds t = M·p .. M·p + M - 1."""
    half = fft_size // 2
    x = F.pad(x.to(compute_dtype(x)), (0, half - x.shape[-1]))
    return x.reshape(*x.shape[:-1], half // inner_size, inner_size)


def spectrum_reference(x: Tensor, fft_size: int, inner_size: int) -> Tensor:
    """(..., P/2+1, M) complex: FFT_N(x)[P·k1 + k2] at [k2, k1], by the four steps in torch.fft."""
    P = outer_size(fft_size, inner_size)
    a = torch.fft.rfft(_columns(x, fft_size, inner_size), n=P, dim=-2)  # outer DFT down the columns
    return torch.fft.fft(a * twiddles(fft_size, inner_size, a), dim=-1)


def conv_reference(x: Tensor, spectrum: Tensor, conjugate: bool) -> Tensor:
    """fourstep_conv in torch.fft, the algorithm the kernels run (in x's compute dtype)."""
    inner_size = spectrum.shape[-1]
    fft_size = spectrum_fft_size(spectrum)
    P, L = outer_size(fft_size, inner_size), x.shape[-1]
    X = spectrum_reference(x, fft_size, inner_size)
    Y = X * (spectrum.conj_physical() if conjugate else spectrum).to(X.dtype)
    tw = twiddles(fft_size, inner_size, X)
    c = torch.fft.ifft(Y, dim=-1, norm="forward") * tw.conj_physical()  # unnormalised: the 1/N is in the spectrum
    y = torch.fft.irfft(c, n=P, dim=-2, norm="forward")[..., : P // 2, :]
    return y.reshape(*y.shape[:-2], -1)[..., :L].to(x.dtype).contiguous()


def filter_spectrum(k: Tensor, fft_size: int, skip: Tensor | None = None, inner: int | None = None) -> Tensor:
    """k's four-step spectrum, (C, P/2+1, M) complex, scaled by 1/N, with the skip term D
    folded in (K + D/N: D·u is the convolution with D at lag 0). Differentiable in k and D.
    On the GPU the spectrum kernels compute it (fp32), as they do u's."""
    x = k.unsqueeze(0).to(torch.float32 if k.is_cuda else compute_dtype(k))
    spectrum = torch.view_as_complex(fourstep_spectrum_op(x, fft_size, inner or inner_for(fft_size), 1.0 / fft_size))[0]
    return spectrum if skip is None else fold_skip(spectrum, skip, fft_size)


def fold_skip(spectrum: Tensor, skip: Tensor, fft_size: int) -> Tensor:
    """The spectrum of k + D·δ: D·u is the convolution with D at lag 0, so K + D/N."""
    return spectrum + (skip.to(spectrum.real.dtype) / fft_size).reshape(-1, 1, 1)


# --------------------------------------------------------------------------- ops


@torch.library.custom_op("monarch_fftconv::fourstep_conv", mutates_args=(), device_types="cpu")
def fourstep_conv(x: Tensor, spectrum: Tensor, conjugate: bool) -> Tensor:
    return conv_reference(x, torch.view_as_complex(spectrum.contiguous()), conjugate)


@fourstep_conv.register_fake
def _(x: Tensor, spectrum: Tensor, conjugate: bool) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("monarch_fftconv::fourstep_spectrum", mutates_args=(), device_types="cpu")
def fourstep_spectrum(x: Tensor, fft_size: int, inner_size: int, scale: float) -> Tensor:
    return torch.view_as_real(spectrum_reference(x, fft_size, inner_size) * scale).contiguous()


@fourstep_spectrum.register_fake
def _(x: Tensor, fft_size: int, inner_size: int, scale: float) -> Tensor:
    shape = (*x.shape[:-1], spectrum_rows(fft_size, inner_size), inner_size, 2)
    return x.new_empty(shape, dtype=compute_dtype(x))


def _spectrum_setup_context(ctx, inputs, output) -> None:
    x, ctx.fft_size, ctx.inner_size, ctx.scale = inputs
    ctx.length, ctx.dtype = x.shape[-1], x.dtype


def _spectrum_backward(ctx, grad: Tensor):
    """X = B·x with x real: dx = Re(Bᴴ dX). Bᴴ: the unnormalised inverse FFT_M, the conjugate
    twiddles and the outer DFT's adjoint, Σ_{k2 <= P/2} W_P^(-p·k2)·c[k2], which is irfft's
    Hermitian sum once each middle row is halved (irfft counts them twice)."""
    fft_size, inner_size = ctx.fft_size, ctx.inner_size
    G = torch.view_as_complex(grad.contiguous()) * ctx.scale
    rows = G.shape[-2]
    c = torch.fft.ifft(G, dim=-1, norm="forward") * _table(_adjoint_twiddles, fft_size, inner_size, G, G.dtype)
    x = torch.fft.irfft(c, n=outer_size(fft_size, inner_size), dim=-2, norm="forward")[..., : rows - 1, :]
    return x.reshape(*x.shape[:-2], -1)[..., : ctx.length].to(ctx.dtype), None, None, None


torch.library.register_autograd("monarch_fftconv::fourstep_spectrum", _spectrum_backward,
                                setup_context=_spectrum_setup_context)


def _setup_context(ctx, inputs, output) -> None:
    x, spectrum, conjugate = inputs
    ctx.save_for_backward(x, spectrum)
    ctx.conjugate = conjugate


def _backward(ctx, grad: Tensor):
    """y = Re(A·(X ⊙ K)) with A complex-linear (the inner inverse, the twiddles and the outer
    inverse, which counts the middle rows twice). So
      dx = the same pipeline on grad with conj K (the correlation),
      dK = w ⊙ Σ_b conj(X_b) ⊙ DY_b, w the row weights, DY the spectrum of grad."""
    x, spectrum = ctx.saved_tensors
    needs_x, needs_spectrum, _ = ctx.needs_input_grad
    grad = grad if grad.dtype == x.dtype else grad.to(x.dtype)
    grad_x = grad_spectrum = None
    if needs_x:
        grad_x = fourstep_conv_op(grad, spectrum, not ctx.conjugate)
    if needs_spectrum:
        inner_size = spectrum.shape[2]
        fft_size = spectrum_fft_size(spectrum)
        X = torch.view_as_complex(fourstep_spectrum_op(x, fft_size, inner_size, 1.0))
        DY = torch.view_as_complex(fourstep_spectrum_op(grad, fft_size, inner_size, 1.0))
        g = torch.linalg.vecdot(X, DY, dim=0) * row_weights(fft_size, inner_size, X)  # Σ_b conj(X)·DY
        grad_spectrum = torch.view_as_real(g.conj_physical() if ctx.conjugate else g)
        if grad_spectrum.dtype != spectrum.dtype:
            grad_spectrum = grad_spectrum.to(spectrum.dtype)
    return grad_x, grad_spectrum, None


torch.library.register_autograd("monarch_fftconv::fourstep_conv", _backward, setup_context=_setup_context)

fourstep_conv_op = torch.ops.monarch_fftconv.fourstep_conv.default
fourstep_spectrum_op = torch.ops.monarch_fftconv.fourstep_spectrum.default


def conv(u: Tensor, spectrum: Tensor) -> Tensor:
    """y = causal_conv(u, k) from k's `filter_spectrum` (complex), differentiable in both."""
    return fourstep_conv_op(u, torch.view_as_real(spectrum), False)
