"""The Hopper (wgmma) Monarch kernel, split 128 x 128 (4096 < L <= 8192), bf16 and fp16.

It runs on request (MONARCH_FFTCONV_TC_KERNEL=sm90, read per call) until it beats the
mma.sync kernel; these tests hold it to what the default kernels are held to: the float64
budget, the emulation of its precision, every output written, half I/O, the skip term with
strided input, sequence independence, and agreement with the mma.sync kernel. Skipped
without a GPU."""

import pytest
import torch

import monarch_fftconv as mf
from monarch_fftconv.backends import BACKEND_ENV

from helpers import BUDGETS, GPU_WATCHDOG_S, randn, reference, rel_l2
from test_cuda import assert_sequences_stay_independent, emulate, poisoned_call

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.watchdog(GPU_WATCHDOG_S)]

DEVICE = "cuda"
KERNEL_ENV = "MONARCH_FFTCONV_TC_KERNEL"
PRECISIONS = ["bf16", "fp16"]


@pytest.fixture(params=["sm90", "sm90-2seq"])
def sm90(request, monkeypatch):
    """The kernel with one sequence in flight per CTA (the request "sm90"), and with two, a warpgroup each ("sm90-2seq"). Through
    the ops (MONARCH_FFTCONV_BACKEND=portable): calls that fill the GPU would otherwise take the
    fp32 kernel."""
    monkeypatch.setenv(KERNEL_ENV, request.param)
    monkeypatch.setenv(BACKEND_ENV, "portable")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("batch, channels, length, filter_len", [(3, 5, 8192, 8192), (2, 3, 4097, 4097),
                                                                 (1, 7, 8191, 100), (5, 2, 6000, 6000)])
def test_budget_and_emulation(batch, channels, length, filter_len, precision, sm90, gen):
    u, k = randn(gen, batch, channels, length, device=DEVICE), randn(gen, channels, filter_len, device=DEVICE)
    y = poisoned_call(lambda: mf.fftconv(u, k, precision=precision), u)
    assert torch.isfinite(y).all(), "unwritten (NaN) outputs"
    assert rel_l2(y, reference(u, k)) <= BUDGETS[precision]
    assert rel_l2(y, emulate(u, k, precision)) <= BUDGETS[precision] / 4


@pytest.mark.parametrize("precision", PRECISIONS)
def test_agrees_with_the_mma_sync_kernel(precision, monkeypatch, gen):
    """Same rounding points, so the two kernels agree far inside the budget."""
    u, k = randn(gen, 4, 6, 8192, device=DEVICE), randn(gen, 6, 8192, device=DEVICE)
    monkeypatch.setenv(KERNEL_ENV, "sm80")
    old = mf.fftconv(u, k, precision=precision)
    monkeypatch.setenv(KERNEL_ENV, "sm90")
    new = mf.fftconv(u, k, precision=precision)
    assert not torch.equal(old, new), "the request did not reach the Hopper kernel"
    assert rel_l2(new, old) <= BUDGETS[precision] / 2


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("io_dtype", [torch.bfloat16, torch.float16])
def test_half_io(io_dtype, precision, sm90, gen):
    u, k = randn(gen, 3, 4, 8000, device=DEVICE, dtype=io_dtype), randn(gen, 4, 8000, device=DEVICE)
    y = poisoned_call(lambda: mf.fftconv(u, k, precision=precision), u)
    assert y.dtype == io_dtype and torch.isfinite(y).all()
    io_rounding = 2.0 ** -8 if io_dtype == torch.bfloat16 else 2.0 ** -11
    assert rel_l2(y, reference(u, k)) <= BUDGETS[precision] + io_rounding


@pytest.mark.parametrize("precision", PRECISIONS)
def test_skip_term_and_strided_input(precision, sm90, gen):
    base = randn(gen, 3, 10, 7001, device=DEVICE)
    u = base[:, 1::2]  # channel stride 2, odd offset: the unaligned load path
    k, D = randn(gen, 5, 7001, device=DEVICE), randn(gen, 5, device=DEVICE)
    y = poisoned_call(lambda: mf.fftconv(u, k, D=D, precision=precision), u)
    assert rel_l2(y, reference(u, k, D)) <= BUDGETS[precision]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_sequences_stay_independent(precision, sm90, gen):
    assert_sequences_stay_independent(precision, gen)


def test_more_sequences_than_ctas(sm90, gen):
    """A persistent grid: every CTA loops over many sequences (the tables and buffers reused)."""
    u, k = randn(gen, 16, 64, 8192, device=DEVICE), randn(gen, 64, 8192, device=DEVICE)
    y = mf.fftconv(u, k, precision="bf16")
    assert rel_l2(y, reference(u, k)) <= BUDGETS["bf16"]


def test_explain_names_the_kernel(monkeypatch, gen):
    u, k = randn(gen, 1, 2, 8192, device=DEVICE), randn(gen, 2, 8192, device=DEVICE)
    mf.fftconv(u, k, precision="bf16")  # loads the extension
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    assert "mma.sync" in mf.explain(u, k, precision="bf16")["kernel"]
    monkeypatch.setenv(KERNEL_ENV, "sm90")
    assert "wgmma" in mf.explain(u, k, precision="bf16")["kernel"]
    assert "mma.sync" in mf.explain(u[..., :4096], k[..., :4096], precision="bf16")["kernel"]  # not 128x128
