"""Long sequences, N = 2·next_pow2(L) > 32768: the four-step algorithm, and its CPU spec.

One N-point FFT does not fit on chip, so it is cut in two, N = P·M: time t = m + M·p, frequency
f = P·k1 + k2. A P-point DFT down each column m (the outer stage, with the twiddles
W_N^(m·k2)) leaves rows k2 of M values, whose M-point FFTs are the spectrum in the order
X[k2][k1] = FFT_N(x)[P·k1 + k2]. The filter product and the inverse transforms run on those
rows, and the outer stage's inverse gives y. x is real: only the rows k2 = 0 .. P/2 are kept
(the others are their conjugates), and only the first half of the columns holds data (the
zero padding). docs/design.md derives it; csrc/fourstep/ runs it on the GPU.

At these sizes the `monarch_fftconv::*` ops (ops.py) take this layout: the filter spectrum
is (C, P/2+1, M, 2) real (a complex view), scaled by 1/N. Their CPU implementations are the
functions here, the same steps in torch.fft, which the kernels are tested against:

====================================================  ======================================
``spectrum_reference(x, N, M)``                       x's spectrum, rows k2 <= P/2
``filter_spectrum_reference(k, N)``                   k's, times 1/N (the op's layout)
``conv_reference(x, S, skip, conjugate)``             y = x convolved (correlated) with S
``backward_reference(dy, u, S, skip, filter_len)``    (du, dk, dD), the kernels' algorithm (X
                                                      given, as a kept forward spectrum, or computed)
====================================================  ======================================

The CPU code conjugates with conj_physical, never with lazy conjugate views: a product with a
conjugate view came out unconjugated when AOTAutograd ran an op (torch 2.13, CPU; opcheck
caught it).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .planner import built_as_normal_tensors, compute_dtype

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


def _twiddles(fft_size: int, inner_size: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(P/2+1, M) complex: W_N^(m·k2) = exp(-2πi·m·k2/N), the exponent reduced exactly."""
    rows = spectrum_rows(fft_size, inner_size)
    exponent = (torch.arange(rows).unsqueeze(1) * torch.arange(inner_size).unsqueeze(0)) % fft_size
    angle = exponent.to(torch.float64) * (-2 * math.pi / fft_size)
    return torch.polar(torch.ones_like(angle), angle).to(dtype=dtype, device=device)


@functools.lru_cache(maxsize=64)  # a few MB each at most; the backward asks for them every step
@built_as_normal_tensors
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


def covers(fft_size: int) -> bool:
    """Whether N takes the four-step layout and kernels (beyond the on-chip radix kernels)."""
    return MIN_FFT_SIZE <= fft_size


def spectrum_shape(channels: int, fft_size: int) -> tuple[int, int, int, int]:
    """The filter spectrum's shape as the ops hold it: (C, P/2+1, M, 2) real."""
    return channels, spectrum_rows(fft_size), inner_for(fft_size), 2


def filter_spectrum_reference(k: Tensor, fft_size: int, inner: int | None = None) -> Tensor:
    """k's four-step spectrum, (C, P/2+1, M) complex in k's compute dtype, scaled by 1/N."""
    return spectrum_reference(k, fft_size, inner or inner_for(fft_size)) / fft_size


def fold_skip(spectrum: Tensor, skip: Tensor | None, fft_size: int) -> Tensor:
    """The spectrum of k + D·δ: D·u is the convolution with D at lag 0, so K + D/N."""
    if skip is None:
        return spectrum
    return spectrum + (skip.to(spectrum.real.dtype) / fft_size).reshape(-1, 1, 1)


def inverse_reference(rows: Tensor, fft_size: int, length: int) -> Tensor:
    """The back half of the algorithm: per row the unnormalised inverse FFT_M, the conjugate
    twiddles, the inverse outer DFT (irfft: the middle rows count twice), the first `length`
    samples (length <= N: past N/2, a filter gradient's negative lags).
    (..., P/2+1, M) complex -> (..., length) real."""
    inner_size = rows.shape[-1]
    P = outer_size(fft_size, inner_size)
    c = torch.fft.ifft(rows, dim=-1, norm="forward") * twiddles(fft_size, inner_size, rows).conj_physical()
    y = torch.fft.irfft(c, n=P, dim=-2, norm="forward")[..., : P // 2 if length <= fft_size // 2 else P, :]
    return y.reshape(*y.shape[:-2], -1)[..., :length]


def conv_reference(x: Tensor, spectrum: Tensor, skip: Tensor | None = None, conjugate: bool = False) -> Tensor:
    """y = x convolved with (correlated with, when conjugate) the filter whose four-step
    spectrum (complex, 1/N folded in) is given, plus skip·x; in x's compute dtype, as the
    kernels run it."""
    fft_size = spectrum_fft_size(spectrum)
    spectrum = fold_skip(spectrum, skip, fft_size)
    X = spectrum_reference(x, fft_size, spectrum.shape[-1])
    Y = X * (spectrum.conj_physical() if conjugate else spectrum).to(X.dtype)
    return inverse_reference(Y, fft_size, x.shape[-1]).contiguous()


def backward_reference(grad: Tensor, u: Tensor, spectrum: Tensor, skip: Tensor | None,
                       filter_len: int, u_spectrum: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """(du, dk, dD) of y = conv(u, k) + D·u, given dy, as the kernels compute them.

    y = Re(A·(X ⊙ S)) with A complex-linear (the back half, inverse_reference), so
      du = the same pipeline on dy with conj S: the correlation;
      dS = w ⊙ Σ_b conj(X_b) ⊙ DY_b, w the row weights (rows 0 and P/2 once, the others twice);
      dk = the spectrum's adjoint on dS/N. That adjoint is the back half with each row divided
           by w (irfft counts the middle rows twice, the adjoint once), so w cancels:
           dk = inverse_reference(Σ_b conj(X_b)·DY_b / N), truncated to filter_len;
      dD = Σ_{b,t} u·dy.
    u_spectrum: X = spectrum_reference(u) as the forward kept it (complex), or None: computed."""
    fft_size = spectrum_fft_size(spectrum)
    inner_size = spectrum.shape[-1]
    du = conv_reference(grad, spectrum, skip, conjugate=True)
    X = spectrum_reference(u, fft_size, inner_size) if u_spectrum is None else u_spectrum
    DY = spectrum_reference(grad, fft_size, inner_size)
    G = (X.conj_physical() * DY).sum(0) / fft_size
    dk = inverse_reference(G, fft_size, filter_len).contiguous()
    dskip = None if skip is None else (u.to(du.dtype) * grad.to(du.dtype)).sum((0, 2))
    return du, dk, dskip
