"""The torch ops: registration (opcheck), gradients through autograd, torch.compile. The
public calls here run the emulating engine, so that they go through the ops (CPU calls
take torch.fft by default)."""

import pytest
import torch

import monarch_fftconv as mf
from monarch_fftconv import ops

from helpers import randn, reference, rel_l2


@pytest.fixture(autouse=True)
def _through_the_ops(portable_engine):
    pass


@pytest.mark.parametrize("batch, channels, length, filter_len", [(2, 3, 7, 7), (3, 2, 16, 5), (1, 1, 1, 1)])
def test_gradcheck_float64(batch, channels, length, filter_len, gen):
    u = randn(gen, batch, channels, length, dtype=torch.float64).requires_grad_()
    k = randn(gen, channels, filter_len, dtype=torch.float64).requires_grad_()
    D = randn(gen, channels, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda u, k, D: mf.fftconv(u, k, D=D), (u, k, D))


@pytest.mark.parametrize("precision, budget", [("fp32", 2e-6), ("bf16", 1.5e-2)])
def test_gradients_match_torch_fft_autograd(precision, budget, gen):
    u = randn(gen, 3, 4, 3000).requires_grad_()
    k = randn(gen, 4, 2500).requires_grad_()
    D = randn(gen, 4).requires_grad_()
    g = randn(gen, 3, 4, 3000)
    ours = torch.autograd.grad(mf.fftconv(u, k, D=D, precision=precision), (u, k, D), g)
    theirs = torch.autograd.grad(reference(u, k, D), (u, k, D), g.double())
    for a, b in zip(ours, theirs):
        assert a.dtype == torch.float32
        assert rel_l2(a, b) <= budget


def test_gradient_only_for_what_needs_it(gen):
    u = randn(gen, 2, 3, 64).requires_grad_()
    k = randn(gen, 3, 64)
    (du,) = torch.autograd.grad(mf.fftconv(u, k).sum(), (u,))
    assert du.shape == u.shape


def test_opcheck(gen):
    u, k, D = randn(gen, 2, 3, 40), randn(gen, 3, 30), randn(gen, 3)
    for skip in (None, D):
        torch.library.opcheck(ops.fftconv, (u.clone().requires_grad_(), k.clone().requires_grad_(), skip, "fp32"))
        torch.library.opcheck(ops.conv_forward, (u, ops.filter_spectrum(k, 40, "bf16"), skip, "bf16"))
    torch.library.opcheck(ops.filter_spectrum, (k, 40, "tf32"))
    spectrum = ops.filter_spectrum(k, 40, "fp32")
    for skip in (None, D):
        torch.library.opcheck(ops.fftconv_backward, (randn(gen, 2, 3, 40), u, spectrum, skip, 30, "fp32"))
        torch.library.opcheck(ops.fftconv_backward_two_sided, (randn(gen, 2, 3, 40), u, spectrum, skip, 30, "fp32"))
    # grouped filters: one row for the three channels (spectrum, filter gradient and the fakes)
    grouped_k = randn(gen, 1, 30)
    grouped = ops.filter_spectrum(grouped_k, 40, "fp32")
    torch.library.opcheck(ops.fftconv, (u.clone().requires_grad_(), grouped_k.clone().requires_grad_(), D, "fp32"))
    torch.library.opcheck(ops.conv_forward, (u, grouped, D, "fp32"))
    for backward in (ops.fftconv_backward, ops.fftconv_backward_two_sided):
        torch.library.opcheck(backward, (randn(gen, 2, 3, 40), u, grouped, D, 30, "fp32"))
    torch.library.opcheck(ops.gated_conv_forward, (u, grouped, D, randn(gen, 2, 3, 40), None, "fp32"))


def lags_float64(grad: torch.Tensor, u: torch.Tensor, filter_len: int) -> torch.Tensor:
    """(C, 2, Lk): Σ_b Σ_t dy[t]·u[t-s] and Σ_b Σ_t dy[t]·u[t+s], one float64 torch.fft
    correlation on a circle of 2L (nothing wraps), independent of the package."""
    n = 2 * u.shape[-1]
    circle = torch.fft.irfft(torch.fft.rfft(grad.double(), n=n) * torch.fft.rfft(u.double(), n=n).conj(), n=n).sum(0)
    lags = torch.arange(filter_len)
    return torch.stack([circle[:, lags], circle[:, (n - lags) % n]], dim=1)


@pytest.mark.parametrize("batch, channels, length, filter_len", [(3, 2, 301, 301), (2, 3, 1000, 77), (1, 2, 40000, 39999)])
def test_two_sided_backward_stores_both_lag_signs(batch, channels, length, filter_len, gen):
    """dk (C, 2, Lk) of the two-sided backward: the causal lags and the anti-causal ones, against
    a float64 correlation; du and dD are the one-sided backward's. 40000: the four-step spec."""
    u, grad = randn(gen, batch, channels, length), randn(gen, batch, channels, length)
    k, D = randn(gen, channels, filter_len) / filter_len**0.5, randn(gen, channels)
    spectrum = ops.filter_spectrum(k, length, "fp32")
    du, dk, dskip = ops.fftconv_backward_two_sided_op(grad, u, spectrum, D, filter_len, "fp32")
    du_causal, dk_causal, dskip_causal = ops.fftconv_backward_op(grad, u, spectrum, D, filter_len, "fp32")
    want = lags_float64(grad, u, filter_len)
    assert dk.shape == (channels, 2, filter_len)
    assert rel_l2(dk[:, 0], want[:, 0]) <= 2e-6 and rel_l2(dk[:, 1], want[:, 1]) <= 2e-6
    assert torch.equal(dk[:, 0, 0], dk[:, 1, 0])  # lag 0 is one bin
    assert rel_l2(dk[:, 0], dk_causal) <= 1e-6
    assert torch.equal(du, du_causal) and torch.equal(dskip, dskip_causal)


def test_torch_compile_fullgraph(gen):
    conv = mf.FFTConv(3, 256)

    def step(x):
        return torch.tanh(conv(x)) * 2

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    x = randn(gen, 2, 3, 256).requires_grad_()
    y = compiled(x)
    torch.testing.assert_close(y, step(x))
    y.sum().backward()
    assert x.grad is not None and conv.filter.grad is not None


def test_backward_reuses_the_saved_spectrum(portable_engine, gen):
    """The forward computes k's spectrum once and saves it; the backward never recomputes it."""
    u = randn(gen, 2, 3, 300).requires_grad_()
    k = randn(gen, 3, 200).requires_grad_()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        y = mf.fftconv(u, k)
        torch.autograd.grad(y, (u, k), torch.ones_like(y))
    calls = [e.name for e in prof.events() if e.name.startswith("monarch_fftconv::")]
    assert calls.count("monarch_fftconv::filter_spectrum") == 1, calls
    assert calls.count("monarch_fftconv::fftconv_backward") == 1, calls


def test_ops_dispatch_by_device():
    """CPU implementations are registered on the monarch_fftconv ops themselves; the CUDA ones
    all come from the extension (tests/test_cuda.py), never from Python."""
    from monarch_fftconv import _extension

    for op in (ops.filter_spectrum, ops.conv_forward, ops.fftconv, ops.fftconv_backward):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op._qualname, "CPU"), op._qualname
        if _extension._result is None:  # not loaded in this process
            assert not torch._C._dispatch_has_kernel_for_dispatch_key(op._qualname, "CUDA"), op._qualname
    assert not [name for name in torch._C._dispatch_get_all_op_names() if name.startswith("monarch_fftconv_cuda::")]


@pytest.mark.parametrize("batch, channels, length, filter_len", [(2, 3, 12345, 3001), (3, 2, 9000, 9000), (2, 3, 777, 1)])
@pytest.mark.parametrize("two_sided", [False, True])
def test_the_conjugated_spectrum_correlates(batch, channels, length, filter_len, two_sided, gen):
    """The split backward's du (binding.cpp, MONARCH_FFTCONV_GRAD_SPLIT): the forward on dy with
    the spectrum's entries conjugated, in the kernels' layout (C, n1/2+1, M, 2), is the
    correlation of dy with k, in float64 (every stored entry is the spectrum at one frequency),
    one-sided and two-sided; with the skip term, the correlation with k' = k + D·δ. (The CPU op
    adds D·dy itself; the CUDA kernels fold D/N into the real parts, which conjugation keeps.)"""
    grad = randn(gen, batch, channels, length, dtype=torch.float64)
    D = randn(gen, channels, dtype=torch.float64)
    if two_sided:
        k = randn(gen, channels, 2, filter_len, dtype=torch.float64)
        spectrum = ops.filter_spectrum_two_sided(k, length, "fp32")
        circle = torch.zeros(channels, 2 * length, dtype=torch.float64)
        circle[:, :filter_len] = k[:, 0]
        circle[:, (2 * length - torch.arange(filter_len)) % (2 * length)] += k[:, 1]  # lag -s; -0 is lag 0
    else:
        k = randn(gen, channels, filter_len, dtype=torch.float64)
        spectrum = ops.filter_spectrum(k, length, "fp32")
        circle = torch.nn.functional.pad(k, (0, 2 * length - filter_len))
    conjugated = spectrum.clone()
    conjugated[..., 1].neg_()
    du = ops.conv_forward(grad, conjugated, D, "fp32")
    n = 2 * length
    want = torch.fft.irfft(torch.fft.rfft(grad, n=n) * torch.fft.rfft(circle, n=n).conj(), n=n)[..., :length]
    want = want + D[:, None] * grad
    assert rel_l2(du, want) <= 1e-12
    if not two_sided:
        du_backward = ops.fftconv_backward(grad, randn(gen, batch, channels, length, dtype=torch.float64), spectrum,
                                           D, filter_len, "fp32")[0]
        assert rel_l2(du, du_backward) <= 1e-12
