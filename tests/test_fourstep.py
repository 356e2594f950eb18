"""The four-step algorithm for long sequences (N > 32768), on the CPU: its torch.fft
implementation (the spec of csrc/fftconv_fourstep.cu) against float64 torch.fft, at small sizes
with a small inner size M, so that every property is checked in CI."""

import pytest
import torch

from monarch_fftconv import fourstep

from helpers import randn, reference, rel_l2

# (batch, channels, L, Lk, inner size M): N = 2·next_pow2(L) = P·M with P from 4 to 128
CASES = [(2, 3, 32, 32, 8), (3, 2, 29, 7, 4), (1, 2, 64, 64, 8), (2, 2, 100, 51, 16), (1, 1, 255, 255, 16),
         (1, 2, 250, 99, 4)]  # the last: P = 128


def fft_size(length: int) -> int:
    return 2 * (1 << (length - 1).bit_length())


@pytest.mark.parametrize("batch, channels, length, filter_len, inner", CASES)
def test_spectrum_is_the_ffts_in_four_step_order(batch, channels, length, filter_len, inner, gen):
    x = randn(gen, batch, channels, length, dtype=torch.float64)
    n = fft_size(length)
    P = n // inner
    ours = fourstep.spectrum_reference(x, n, inner)
    full = torch.fft.fft(x, n=n)  # f = P·k1 + k2 at [k1, k2] of the (M, P) view
    want = full.reshape(batch, channels, inner, P)[..., : P // 2 + 1].transpose(-1, -2)
    assert ours.shape == (batch, channels, P // 2 + 1, inner)
    assert rel_l2(torch.view_as_real(ours), torch.view_as_real(want)) < 1e-13


@pytest.mark.parametrize("batch, channels, length, filter_len, inner", CASES)
@pytest.mark.parametrize("with_skip", [False, True])
def test_conv_is_the_causal_convolution(batch, channels, length, filter_len, inner, with_skip, gen):
    u = randn(gen, batch, channels, length, dtype=torch.float64)
    k = randn(gen, channels, filter_len, dtype=torch.float64)
    D = randn(gen, channels, dtype=torch.float64) if with_skip else None
    spectrum = fourstep.filter_spectrum(k, fft_size(length), D, inner=inner)
    assert spectrum.shape == (channels, fft_size(length) // inner // 2 + 1, inner)
    y = fourstep.conv(u, spectrum)
    assert y.shape == u.shape and y.dtype == u.dtype
    assert rel_l2(y, reference(u, k, D)) < 1e-13


def test_conjugate_spectrum_gives_the_correlation(gen):
    """conjugate=True is the backward's du: Σ_s dy[s]·k[s - t]."""
    u, k = randn(gen, 2, 3, 40, dtype=torch.float64), randn(gen, 3, 40, dtype=torch.float64)
    spectrum = fourstep.filter_spectrum(k, fft_size(40), inner=8)
    ours = fourstep.fourstep_conv(u, torch.view_as_real(spectrum), True)
    want = torch.stack([torch.stack([torch.stack([(u[b, c, t:] * k[c, : 40 - t]).sum() for t in range(40)])
                                     for c in range(3)]) for b in range(2)])
    assert rel_l2(ours, want) < 1e-13


@pytest.mark.parametrize("batch, channels, length, filter_len, inner", CASES[:3])
def test_gradcheck_through_the_ops(batch, channels, length, filter_len, inner, gen):
    """The ops' autograd (the correlation for dx; w·Σ conj(X)·DY for the spectrum, middle rows
    counted twice) against finite differences, through the spectrum of k and the skip term."""
    u = randn(gen, batch, channels, length, dtype=torch.float64).requires_grad_()
    k = randn(gen, channels, filter_len, dtype=torch.float64).requires_grad_()
    D = randn(gen, channels, dtype=torch.float64).requires_grad_()
    n = fft_size(length)
    assert torch.autograd.gradcheck(lambda u, k, D: fourstep.conv(u, fourstep.filter_spectrum(k, n, D, inner)),
                                    (u, k, D))


def test_gradcheck_of_the_conjugate_op(gen):
    x = randn(gen, 2, 2, 30, dtype=torch.float64).requires_grad_()
    spectrum = torch.view_as_real(fourstep.filter_spectrum(randn(gen, 2, 30, dtype=torch.float64), 64, inner=8))
    spectrum = spectrum.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x, s: fourstep.fourstep_conv(x, s, True), (x, spectrum))


def test_opcheck():
    """Schemas, fake kernels and autograd registration agree with the implementations."""
    x = torch.randn(2, 3, 50, dtype=torch.float64)
    spectrum = torch.view_as_real(fourstep.filter_spectrum(torch.randn(3, 20, dtype=torch.float64), 128, inner=16))
    torch.library.opcheck(torch.ops.monarch_fftconv.fourstep_conv.default, (x, spectrum.clone().requires_grad_(), False))
    torch.library.opcheck(torch.ops.monarch_fftconv.fourstep_spectrum.default, (x, 128, 16, 0.5))


def test_half_io_keeps_the_dtype(gen):
    u = randn(gen, 2, 2, 60, dtype=torch.bfloat16)
    k = randn(gen, 2, 60)
    y = fourstep.conv(u, fourstep.filter_spectrum(k, 128, inner=16))
    assert y.dtype == torch.bfloat16
    assert rel_l2(y, reference(u, k)) < 1e-2


def test_gradcheck_of_the_spectrum_op(gen):
    """The spectrum's adjoint (irfft's Hermitian sum with the middle rows halved)."""
    x = randn(gen, 2, 3, 50, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: fourstep.fourstep_spectrum(x, 128, 16, 0.25), (x,))
