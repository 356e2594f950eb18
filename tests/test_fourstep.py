"""The four-step algorithm for long sequences (N > 32768), on the CPU: its torch.fft spec (the
algorithm of csrc/fourstep/fftconv_fourstep.cu) against float64 torch.fft at small sizes with a small
inner size M, so that every property is checked in CI; and the ops, which take the four-step
layout from N = 65536, through the portable engine."""

import pytest
import torch

import monarch_fftconv as mf
from monarch_fftconv import fourstep, ops

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
    spectrum = fourstep.filter_spectrum_reference(k, fft_size(length), inner)
    assert spectrum.shape == (channels, fft_size(length) // inner // 2 + 1, inner)
    y = fourstep.conv_reference(u, spectrum, D)
    assert y.shape == u.shape and y.dtype == u.dtype
    assert rel_l2(y, reference(u, k, D)) < 1e-13


def test_conjugate_spectrum_gives_the_correlation(gen):
    """conjugate=True is the backward's du: Σ_s dy[s]·k[s - t]."""
    u, k = randn(gen, 2, 3, 40, dtype=torch.float64), randn(gen, 3, 40, dtype=torch.float64)
    spectrum = fourstep.filter_spectrum_reference(k, fft_size(40), 8)
    ours = fourstep.conv_reference(u, spectrum, conjugate=True)
    want = torch.stack([torch.stack([torch.stack([(u[b, c, t:] * k[c, : 40 - t]).sum() for t in range(40)])
                                     for c in range(3)]) for b in range(2)])
    assert rel_l2(ours, want) < 1e-13


@pytest.mark.parametrize("batch, channels, length, filter_len, inner", CASES)
def test_backward_is_autograd_of_the_convolution(batch, channels, length, filter_len, inner, gen):
    """The kernels' backward algorithm (du by the correlation; dk by the back half on
    Σ_b conj(X_b)·DY_b / N, the row weights cancelled; dD = Σ u·dy) against float64 autograd of
    the plain torch.fft convolution."""
    u = randn(gen, batch, channels, length, dtype=torch.float64).requires_grad_()
    k = randn(gen, channels, filter_len, dtype=torch.float64).requires_grad_()
    D = randn(gen, channels, dtype=torch.float64).requires_grad_()
    dy = randn(gen, batch, channels, length, dtype=torch.float64)
    want = torch.autograd.grad(reference(u, k, D), (u, k, D), dy)
    spectrum = fourstep.filter_spectrum_reference(k.detach(), fft_size(length), inner)
    ours = fourstep.backward_reference(dy, u.detach(), spectrum, D.detach(), filter_len)
    for name, a, b in zip(("du", "dk", "dD"), ours, want):
        assert a.shape == b.shape, name
        assert rel_l2(a, b) < 1e-12, name


def test_half_io_keeps_the_dtype(gen):
    u = randn(gen, 2, 2, 60, dtype=torch.bfloat16)
    k = randn(gen, 2, 60)
    y = fourstep.conv_reference(u, fourstep.filter_spectrum_reference(k, 128, 16)).to(u.dtype)
    assert y.dtype == torch.bfloat16
    assert rel_l2(y, reference(u, k)) < 1e-2


# ---------------------------------------------------------------- the ops at N >= 65536
# Through the portable engine (the ops' CPU implementations): the four-step layout.

@pytest.fixture
def through_the_ops(portable_engine):
    pass


def test_ops_take_the_four_step_layout(through_the_ops, gen):
    """At N = 65536 the filter spectrum is (C, P/2+1, M, 2) = (2, 5, 8192, 2)."""
    k = randn(gen, 2, 300)
    spectrum = ops.filter_spectrum(k, 16385, "fp32")
    assert spectrum.shape == (2, 5, 8192, 2)
    want = fourstep.spectrum_reference(k.double(), 65536, 8192) / 65536
    assert rel_l2(spectrum, torch.view_as_real(want)) < 1e-6


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_step_at_n_65536(through_the_ops, precision, gen):
    """Forward and the three gradients through the ops' CPU four-step, L = 20001, Lk < L."""
    u = randn(gen, 2, 2, 20001).requires_grad_()
    k = randn(gen, 2, 5000).requires_grad_()
    D = randn(gen, 2).requires_grad_()
    dy = randn(gen, 2, 2, 20001)
    y = mf.fftconv(u, k, D=D, precision=precision)
    assert rel_l2(y, reference(u, k, D)) < 2e-6  # fp32 arithmetic whatever the precision
    ours = torch.autograd.grad(y, (u, k, D), dy)
    want = torch.autograd.grad(reference(u, k, D), (u, k, D), dy.double())
    for a in ours:
        assert a.dtype == torch.float32
    assert rel_l2(ours[0], want[0]) < 3e-6 and rel_l2(ours[1], want[1]) < 3e-6
    # dD is a sum of 40,002 products in fp32 and of ~200 against terms of ~0.6: its error is bound
    # by the terms' absolute sum (rel_l2 against the small sum failed at 4.9e-6 for one seed)
    assert ((ours[2].double() - want[2]).abs() <= 1e-6 * (dy.double() * u.double()).abs().sum((0, 2))).all()


def test_opcheck_at_n_65536(through_the_ops, gen):
    """Schemas, fake kernels and autograd registration agree with the four-step implementations."""
    u, k, D = randn(gen, 1, 2, 16500), randn(gen, 2, 100), randn(gen, 2)
    torch.library.opcheck(ops.fftconv, (u.clone().requires_grad_(), k.clone().requires_grad_(), D, "fp32"))
    spectrum = ops.filter_spectrum(k, 16500, "fp32")
    torch.library.opcheck(ops.conv_forward, (u, spectrum, D, "bf16"))
    torch.library.opcheck(ops.fftconv_backward, (randn(gen, 1, 2, 16500), u, spectrum, D, 100, "fp32"))


# ---------------------------------------------------------------- u's spectrum kept for the backward
# (the CUDA autograd's MONARCH_FFTCONV_KEEP_SPECTRUM=1 calls these two ops; tests/test_cuda.py
# holds the kernels to the same properties)

def test_kept_spectrum_gives_fftconvs_backward(through_the_ops, gen):
    """fftconv_keeping_spectrum returns fftconv's y and S and u's four-step spectrum X (against
    float64 torch.fft); fftconv_backward_from_spectrum on that X returns fftconv_backward's
    (du, dk, dD), the same bits, and they are the float64 gradients: a grouped filter (2 rows for
    4 channels), a skip term, Lk < L, odd L."""
    u, k, D, dy = randn(gen, 2, 4, 20001), randn(gen, 2, 777) / 777**0.5, randn(gen, 4), randn(gen, 2, 4, 20001)
    y, spectrum, kept = ops.fftconv_keeping_spectrum(u, k, D, "fp32")
    y_plain, spectrum_plain = ops.fftconv(u, k, D, "fp32")
    assert torch.equal(y, y_plain) and torch.equal(spectrum, spectrum_plain)
    full = torch.fft.fft(u.double(), n=65536).reshape(2, 4, 8192, 8)[..., :5].transpose(-1, -2)  # [k2, k1]
    assert kept.shape == (2, 4, 5, 8192, 2) and kept.dtype == torch.float32
    assert rel_l2(kept, torch.view_as_real(full)) < 2e-6
    ours = ops.fftconv_backward_from_spectrum(dy, u, kept, spectrum, D, 777, "fp32")
    plain = ops.fftconv_backward(dy, u, spectrum, D, 777, "fp32")
    for name, a, b in zip(("du", "dk", "dD"), ours, plain):
        assert torch.equal(a, b), name
    u64, k64 = u.double().requires_grad_(), k.double().requires_grad_()
    want = torch.autograd.grad(reference(u64, k64.repeat_interleave(2, dim=0), D.double()), (u64, k64), dy.double())
    assert rel_l2(ours[0], want[0]) < 3e-6 and rel_l2(ours[1], want[1]) < 3e-6


def test_kept_spectrum_is_empty_below_n_65536(through_the_ops, gen):
    """Below the four-step sizes nothing is kept (X is empty) and the backward from it is
    fftconv_backward's, bit for bit; an X of another shape or dtype is refused, at either size."""
    u, k, dy = randn(gen, 3, 2, 301), randn(gen, 2, 301), randn(gen, 3, 2, 301)
    y, spectrum, kept = ops.fftconv_keeping_spectrum(u, k, None, "fp32")
    assert kept.shape == (0,) and torch.equal(y, ops.fftconv(u, k, None, "fp32")[0])
    ours = ops.fftconv_backward_from_spectrum(dy, u, kept, spectrum, None, 301, "fp32")
    for a, b in zip(ours, ops.fftconv_backward(dy, u, spectrum, None, 301, "fp32")):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="u_spectrum must be"):
        ops.fftconv_backward_from_spectrum(dy, u, torch.zeros(1), spectrum, None, 301, "fp32")
    long_u = randn(gen, 1, 2, 16500)
    _, long_spectrum, long_kept = ops.fftconv_keeping_spectrum(long_u, k, None, "fp32")
    for wrong in (long_kept[:, :1], long_kept.double(), kept):
        with pytest.raises(ValueError, match="u_spectrum must be"):
            ops.fftconv_backward_from_spectrum(long_u, long_u, wrong, long_spectrum, None, 301, "fp32")


def test_opcheck_kept_spectrum_ops(through_the_ops, gen):
    """The two ops' schemas and fake kernels agree with their implementations, at N = 65536 and
    below (where X is empty)."""
    for length in (16500, 300):
        u, k, D = randn(gen, 1, 2, length), randn(gen, 2, 100), randn(gen, 2)
        torch.library.opcheck(ops.fftconv_keeping_spectrum, (u, k, D, "fp32"))
        _, spectrum, kept = ops.fftconv_keeping_spectrum(u, k, D, "fp32")
        torch.library.opcheck(ops.fftconv_backward_from_spectrum,
                              (randn(gen, 1, 2, length), u, kept, spectrum, D, 100, "fp32"))
