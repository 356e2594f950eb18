"""The fused gated training step on the GPU (backends.FUSED_GATED_TRAINING; skipped without
CUDA): the fp32 forward kernel's gated instance storing z beside y, and the gated grad kernel
(x = pregate ⊙ u and dz = postgate ⊙ dy at its loads, du = pregate ⊙ dx and dpregate = u ⊙ dx at
its store), against float64 autograd and against the switch-off path (the ATen gates around the
ungated kernels). Written in session 21 without a GPU: not yet run. The CPU spec is
tests/test_gated_training.py."""

import pytest
import torch

import monarch_fftconv as mf
from monarch_fftconv import backends, ops

from helpers import BUDGETS, GPU_WATCHDOG_S, randn, rel_l2, requires_cuda
from test_gated_training import gated_reference

pytestmark = [requires_cuda, pytest.mark.watchdog(GPU_WATCHDOG_S)]  # a hang fails, not stalls

DEVICE = "cuda"


@pytest.fixture(scope="module", autouse=True)
def cuda_kernels_registered():
    """The ops' CUDA kernels are registered when the extension loads (tests here call ops directly)."""
    from monarch_fftconv import _extension

    coverage = _extension.coverage(True)
    assert not isinstance(coverage, str), f"the CUDA extension is unavailable: {coverage}"


def cuda_inputs(gen, batch, channels, length, filter_len, gates, with_D, channel_stride=1):
    """u (channel-strided when channel_stride > 1), k, D, pregate, postgate on the GPU, float32."""
    u = randn(gen, batch, channels * channel_stride, length, device=DEVICE)[:, ::channel_stride]
    k = randn(gen, channels, filter_len, device=DEVICE) / filter_len**0.5
    D = randn(gen, channels, device=DEVICE) if with_D else None
    pregate = randn(gen, batch, channels, length, device=DEVICE) if gates in ("pre", "both") else None
    postgate = randn(gen, batch, channels, length, device=DEVICE) if gates in ("post", "both") else None
    return u, k, D, pregate, postgate


def training_step(u, k, D, pregate, postgate, dy, fused, monkeypatch):
    """y and the gradients of every given input, with the switch `fused`."""
    monkeypatch.setattr(backends, "FUSED_GATED_TRAINING", fused)
    leaves = [t.detach().clone().requires_grad_() for t in (u, k, D, pregate, postgate) if t is not None]
    it = iter(leaves[2:])
    D_, pre, post = (next(it) if t is not None else None for t in (D, pregate, postgate))
    y = mf.fftconv(leaves[0], leaves[1], D=D_, pregate=pre, postgate=post)
    return [y, *torch.autograd.grad(y, leaves, dy)]


# N = 2·next_pow2(L): 256 (on chip, thread 0's own pair path), 2048 and 16384 (on chip, uniform
# pairs), 32768 (the scratch route, 512 threads), 131072 (four-step: the ATen gates around).
@pytest.mark.parametrize("length", [100, 1000, 8191, 12345, 40000])
@pytest.mark.parametrize("gates, with_D", [("both", True), ("pre", False), ("post", True)])
def test_fused_training_matches_float64_and_the_aten_gates(length, gates, with_D, monkeypatch, gen):
    """y and the gradients of u, k, D and both gates: within the fp32 budget of float64 autograd
    through the reference, and close to the switch-off path (ATen gates around the kernels); a
    channel-strided u."""
    u, k, D, pregate, postgate = cuda_inputs(gen, 3, 5, length, min(length, 777), gates, with_D, channel_stride=2)
    dy = randn(gen, *u.shape, device=DEVICE)
    fused = training_step(u, k, D, pregate, postgate, dy, True, monkeypatch)
    aten = training_step(u, k, D, pregate, postgate, dy, False, monkeypatch)

    leaves = [t.detach().cpu().double().requires_grad_() for t in (u, k, D, pregate, postgate) if t is not None]
    it = iter(leaves[2:])
    D64, pre64, post64 = (next(it) if t is not None else None for t in (D, pregate, postgate))
    want, _ = gated_reference(leaves[0], leaves[1], D64, pre64, post64)
    wanted = [want, *torch.autograd.grad(want, leaves, dy.cpu().double())]
    for i, (got, expected, off) in enumerate(zip(fused, wanted, aten)):
        assert torch.isfinite(got).all(), f"output {i}"
        assert rel_l2(got.cpu(), expected) <= (1 if i == 0 else 2) * BUDGETS["fp32"], f"output {i}"
        assert rel_l2(got, off) <= 2 * BUDGETS["fp32"], f"output {i} against the switch off"


@pytest.mark.parametrize("length", [1000, 8191])
@pytest.mark.parametrize("gates", ["pre", "post", "both"])
def test_gated_ops_on_cuda_match_their_cpu_spec(length, gates, gen):
    """gated_fftconv and gated_fftconv_backward on CUDA (the kernels' gated instances) against
    the same ops on the CPU (the portable engine composing them), every output written (the
    allocator's next blocks poisoned with NaN)."""
    u, k, D, pregate, postgate = cuda_inputs(gen, 2, 3, length, 333, gates, True)
    dy = randn(gen, *u.shape, device=DEVICE)
    for _ in range(4):
        torch.empty_like(u).fill_(float("nan"))
    y, z, spectrum = ops.gated_fftconv_op(u, k, D, pregate, postgate, "fp32")
    grads = ops.gated_fftconv_backward_op(dy, u, spectrum, D, pregate, postgate, k.shape[-1], "fp32")
    cpu = [None if t is None else t.cpu() for t in (u, k, D, pregate, postgate)]
    y_c, z_c, spectrum_c = ops.gated_fftconv(*cpu, "fp32")
    grads_c = ops.gated_fftconv_backward(dy.cpu(), cpu[0], spectrum_c, cpu[2], cpu[3], cpu[4], k.shape[-1], "fp32")
    assert rel_l2(y.cpu(), y_c) <= BUDGETS["fp32"]
    assert z.shape == z_c.shape and (z.numel() == 0 or rel_l2(z.cpu(), z_c) <= BUDGETS["fp32"])
    for name, got, expected in zip(["du", "dk", "dD", "dpregate", "dpostgate"], grads, grads_c):
        assert got.shape == expected.shape, name
        assert got.numel() == 0 or rel_l2(got.cpu(), expected) <= 2 * BUDGETS["fp32"], name


def test_scratch_route_and_thread_zero_path(monkeypatch, gen):
    """The gated grad kernel on the routes the default does not take at this size: the global
    scratch (MONARCH_FFTCONV_GRAD_ACCUMULATOR=global) and thread 0's own pair path
    (MONARCH_FFTCONV_GRAD_UNIFORM_PAIRS=0): the same gradients as the default route."""
    u, k, D, pregate, postgate = cuda_inputs(gen, 4, 3, 4000, 500, "both", True)
    dy = randn(gen, *u.shape, device=DEVICE)
    spectrum = ops.filter_spectrum_op(k, u.shape[-1], "fp32")

    def grads():
        return ops.gated_fftconv_backward_op(dy, u, spectrum, D, pregate, postgate, k.shape[-1], "fp32")

    default = grads()
    for name, value in (("MONARCH_FFTCONV_GRAD_ACCUMULATOR", "global"), ("MONARCH_FFTCONV_GRAD_UNIFORM_PAIRS", "0")):
        with monkeypatch.context() as m:
            m.setenv(name, value)
            for got, want in zip(grads(), default):
                assert got.numel() == want.numel() and (got.numel() == 0 or rel_l2(got, want) <= 1e-6), name


def test_bf16_io_takes_the_aten_gates_around_the_backward(gen):
    """A bf16 call given to the gated backward op (no gated grad instance for 2-byte io): the
    binding's ATen gates around the ungated backward, within bf16 rounding of the fp32 result."""
    u, k, D, pregate, postgate = cuda_inputs(gen, 2, 3, 1000, 100, "both", True)
    dy = randn(gen, *u.shape, device=DEVICE)
    spectrum = ops.filter_spectrum_op(k, u.shape[-1], "fp32")
    fp32 = ops.gated_fftconv_backward_op(dy, u, spectrum, D, pregate, postgate, 100, "fp32")
    half = [t.bfloat16() for t in (dy, u, pregate, postgate)]
    bf16 = ops.gated_fftconv_backward_op(half[0], half[1], spectrum, D, half[2], half[3], 100, "fp32")
    for got, want in zip(bf16, fp32):
        assert got.numel() == want.numel() and (got.numel() == 0 or rel_l2(got.float(), want) <= 2e-2)


# N = 256 (thread 0's own pair path), 8192 and 16384 (on chip, uniform pairs), 32768 (the
# split backward's filter sums, or the scratch route with the split off), 131072 (four-step: the
# binding's ATen multiply); L = 8191: odd rows, the element-by-element tail.
@pytest.mark.parametrize("length", [100, 4000, 8191, 12345, 40000])
@pytest.mark.parametrize("route", [None, ("MONARCH_FFTCONV_GRAD_ACCUMULATOR", "global"),
                                   ("MONARCH_FFTCONV_GRAD_UNIFORM_PAIRS", "0"), ("MONARCH_FFTCONV_GRAD_SPLIT", "1"),
                                   ("MONARCH_FFTCONV_GRAD_SPLIT", "0")])
def test_dpostgate_in_the_grad_kernel_is_dy_times_z(length, route, monkeypatch, gen):
    """gated_fftconv_backward given z (backends.DPOSTGATE_IN_GRAD_KERNEL's call): dpostgate bit for
    bit dy ⊙ z on every route, every element written (the allocator's next blocks poisoned with
    NaN), and the other gradients the same bits as without z."""
    if route is not None:
        monkeypatch.setenv(*route)
    u, k, D, pregate, postgate = cuda_inputs(gen, 3, 5, length, min(length, 700), "both", True, channel_stride=2)
    dy = randn(gen, *u.shape, device=DEVICE)
    _, z, spectrum = ops.gated_fftconv_op(u, k, D, pregate, postgate, "fp32")
    without = ops.gated_fftconv_backward_op(dy, u, spectrum, D, pregate, postgate, k.shape[-1], "fp32")
    for _ in range(4):
        torch.empty_like(u).fill_(float("nan"))
    grads = ops.gated_fftconv_backward_op(dy, u, spectrum, D, pregate, postgate, k.shape[-1], "fp32", z)
    assert without[4].numel() == 0
    assert torch.equal(grads[4], dy * z)
    for name, got, want in zip(["du", "dk", "dD", "dpregate"], grads, without):
        assert torch.equal(got, want), name


def test_dpostgate_switch_gives_the_same_training_step(monkeypatch, gen):
    """The fused training step with backends.DPOSTGATE_IN_GRAD_KERNEL on and off: y and every
    gradient the same bits (16x32x8192: the default on-chip route)."""
    u, k, D, pregate, postgate = cuda_inputs(gen, 4, 32, 8192, 8192, "both", True)
    dy = randn(gen, *u.shape, device=DEVICE)
    steps = []
    for on in (False, True):
        monkeypatch.setattr(backends, "DPOSTGATE_IN_GRAD_KERNEL", on)
        steps.append(training_step(u, k, D, pregate, postgate, dy, True, monkeypatch))
    for i, (off, on) in enumerate(zip(*steps)):
        assert torch.equal(on, off), f"output {i}"
