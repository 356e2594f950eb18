"""The Hopper kernel's data flow (csrc/tc/sm90_kernel.cuh, docs/design.md), in float64 on the CPU.

The kernel keeps every GEMM an exact m64 tile by two tricks that no other path uses: the
Nyquist row k1 = n/2 of the Hermitian half rides in row 0's imaginary slot (row 0 of the
stage-1 sine table replaced by (-1)^r, the same table read transposed by inverse stage 1),
and leaves the GEMMs for a 1-D transform in between. This model runs exactly that sequence
of products with float64 matrices, so the algebra is checked on every CI run, at the kernel's
split and at smaller ones, against torch.fft's convolution."""

import math

import pytest
import torch

from helpers import randn, reference, rel_l2


def monarch_filter_spectrum(k: torch.Tensor, n: int) -> torch.Tensor:
    """K[k1][k2] = FFT_N(pad k)[k1 + n·k2] / N for k1 <= n/2 (the kernels' layout), complex128."""
    N = n * n
    full = torch.fft.fft(k.double(), n=N) / N
    k1 = torch.arange(n // 2 + 1).unsqueeze(1)
    k2 = torch.arange(n).unsqueeze(0)
    return full[k1 + n * k2]


def sm90_dataflow(x: torch.Tensor, K: torch.Tensor, n: int) -> torch.Tensor:
    """One sequence through the kernel's stages: x (L,), K (n/2+1, n) -> y (L,)."""
    half, N, L = n // 2, n * n, x.shape[-1]
    X = torch.zeros(n * half, dtype=torch.float64)
    X[:L] = x.double()
    X = X.view(half, n)                                                      # (r, s): rows r < n/2 live
    idx = torch.arange(half)
    angle = 2 * math.pi * torch.outer(idx, idx).double() / n
    f1c, s1 = torch.cos(angle), -torch.sin(angle)                            # (k1, r)
    s1[0] = (-1.0) ** idx.double()                                           # the Nyquist row of F1

    # stage 1: two real GEMMs; row 0 is real, its imaginary slot the Nyquist row
    a_re, a_im = f1c @ X, s1 @ X                                             # (k1, s)
    s = torch.arange(n).double()
    nyquist_twiddle = torch.exp(-2j * math.pi * half * s / N)
    nyq_b = a_im[0] * nyquist_twiddle
    a_im = a_im.clone()
    a_im[0] = 0
    twiddle = torch.exp(-2j * math.pi * torch.outer(idx.double(), s) / N)    # (k1, s); row 0: 1
    A = torch.complex(a_re, a_im) * twiddle

    # stage 2 and the filter (rows 0 .. n/2 - 1), the Nyquist row apart in fp32 in the kernel
    F2 = torch.exp(-2j * math.pi * torch.outer(s, s) / n)                    # (s, k2), symmetric
    P = (A @ F2) * K[:half]
    nyq_p = (nyq_b @ F2) * K[half]

    # inverse stage 2, conj twiddle and the Hermitian weight (1 for row 0, else 2)
    weight = torch.full((half, 1), 2.0, dtype=torch.float64)
    weight[0] = 1.0
    Ap = (P @ F2.conj()) * twiddle.conj() * weight
    nyq_c = ((nyq_p @ F2.conj()) * nyquist_twiddle.conj()).real
    ap_re, ap_im = Ap.real, Ap.imag.clone()
    ap_im[0] = nyq_c                                                         # row 0's slot carries it back

    # inverse stage 1: cos · Re A' + s1ᵀ · Im A' (s1ᵀ's column 0 is (-1)^r: the Nyquist term)
    y = f1c @ ap_re + s1.T @ ap_im                                           # (r, s)
    return y.reshape(-1)[:L]


@pytest.mark.parametrize("n, length", [(128, 8192), (128, 5001), (16, 128), (32, 300), (8, 17)])
def test_dataflow_is_the_convolution(n, length, gen):
    channels = 2
    x = randn(gen, channels, length, dtype=torch.float64)
    k = randn(gen, channels, length, dtype=torch.float64)
    y = torch.stack([sm90_dataflow(x[c], monarch_filter_spectrum(k[c], n), n) for c in range(channels)])
    assert rel_l2(y, reference(x, k)) < 1e-12


def test_the_nyquist_row_matters(gen):
    """Dropping the row that rides in row 0's imaginary slot breaks the result: the test sees it."""
    n, length = 16, 128
    x, k = randn(gen, length, dtype=torch.float64), randn(gen, length, dtype=torch.float64)
    K = monarch_filter_spectrum(k, n)
    K_without_nyquist = K.clone()
    K_without_nyquist[n // 2] = 0
    assert rel_l2(sm90_dataflow(x, K_without_nyquist, n), reference(x, k)) > 1e-3
