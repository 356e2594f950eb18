"""The fused CUDA kernels (skipped without a GPU; run by benchmarks/run_gpu.sh).

Each kernel is held to: the float64 error budget, closeness to the portable path's
emulation of the same precision, every output element written, sequence independence,
the current stream, and 64-bit indexing."""

import pytest
import torch

import monarch_fftconv as mf
from monarch_fftconv import fourstep, ops, portable
from monarch_fftconv.backends import BACKEND_ENV
from monarch_fftconv.planner import plan_for, spectrum_frequencies

from helpers import (BUDGETS, GPU_WATCHDOG_S, fp16_constant_ceiling, fp16_subnormal_error, randn, reference, rel_l2,
                     two_sided_circle)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

KERNEL_LENGTHS = [128, 256, 512, 1024, 2048, 4096, 8192, 16384]  # N = 2L from 256 to 32768
DEVICE = "cuda"


@pytest.fixture(scope="module", autouse=True)
def cuda_kernels_registered():
    """Loading the extension registers the ops' CUDA kernels. `fftconv` loads it on its first
    CUDA call, but the tests that call an op directly (the spectrum kernel's, the emulation's)
    must not depend on such a call having run before them: under a -k selection they failed
    with NotImplementedError (session 12)."""
    if torch.cuda.is_available():
        from monarch_fftconv import _extension

        coverage = _extension.coverage(True)
        assert not isinstance(coverage, str), f"the CUDA extension is unavailable: {coverage}"


def expected_backend(precision: str, length: int) -> str:
    """For the small calls (a few sequences) these tests make: fp32 takes the radix kernel; bf16
    and fp16 the tensor cores up to N = 16384, tf32 up to N = 4096 (backends.TF32_TENSOR_CORE_MAX_FFT),
    and the radix kernel past those, where no tensor-core kernel runs or it measured slower."""
    n = plan_for(length).fft_size
    radix = precision == "fp32" or n > 16384 or (precision == "tf32" and n > mf.backends.TF32_TENSOR_CORE_MAX_FFT)
    return "cuda-fp32" if radix else "cuda-tensor-core"


def poisoned_call(fn, like: torch.Tensor):
    """Fill the caching allocator's next block with NaN, so unwritten outputs show."""
    torch.empty_like(like, memory_format=torch.contiguous_format).fill_(float("nan"))
    return fn()


def emulate(u: torch.Tensor, k: torch.Tensor, precision: str, D=None) -> torch.Tensor:
    """The portable engine's emulation of `precision`, fed the spectrum the kernel gets."""
    plan = plan_for(u.shape[-1])
    spectrum = torch.view_as_complex(ops.filter_spectrum(k, u.shape[-1], precision))
    return portable.conv_forward(u, spectrum, D, plan, precision)


@pytest.mark.parametrize("precision", list(BUDGETS))
@pytest.mark.parametrize("length", KERNEL_LENGTHS)
def test_kernel_every_size(length, precision, gen):
    u, k = randn(gen, 3, 5, length, device=DEVICE), randn(gen, 5, length, device=DEVICE)
    y = poisoned_call(lambda: mf.fftconv(u, k, precision=precision), u)
    backend = mf.explain(u, k, precision=precision)["backend"]
    assert backend == expected_backend(precision, length)
    assert torch.isfinite(y).all(), "unwritten (NaN) outputs"
    ref = reference(u, k)
    assert rel_l2(y, ref) <= BUDGETS[precision]
    if backend == "cuda-tensor-core":  # the fp32 kernel is a radix FFT, not the emulated Monarch
        assert rel_l2(y, emulate(u, k, precision)) <= BUDGETS[precision] / 4


@pytest.mark.parametrize("length", KERNEL_LENGTHS[:-1])
def test_tf32_tensor_core_kernel_through_the_ops(length, portable_engine, gen):
    """tf32 calls past N = 4096 or half of the GPU take the fp32 kernel by default; the ops
    (MONARCH_FFTCONV_BACKEND=portable) run the tf32 tensor-core kernel at every size, within its
    budget and its emulation."""
    u, k = randn(gen, 3, 5, length, device=DEVICE), randn(gen, 5, length, device=DEVICE)
    y = poisoned_call(lambda: mf.fftconv(u, k, precision="tf32"), u)
    assert torch.isfinite(y).all(), "unwritten (NaN) outputs"
    assert rel_l2(y, reference(u, k)) <= BUDGETS["tf32"]
    assert rel_l2(y, emulate(u, k, "tf32")) <= BUDGETS["tf32"] / 4
    assert rel_l2(y, reference(u, k)) > 10 * BUDGETS["fp32"]  # tf32 operands: not the fp32 kernel


@pytest.mark.parametrize("precision", list(BUDGETS))
@pytest.mark.parametrize("batch, channels, length, filter_len", [(1, 3, 1000, 1000), (3, 2, 5000, 77), (5, 3, 100, 100),
                                                                 (3, 2, 12345, 3001)])
def test_kernel_odd_lengths(batch, channels, length, filter_len, precision, gen):
    u, k = randn(gen, batch, channels, length, device=DEVICE), randn(gen, channels, filter_len, device=DEVICE)
    y = poisoned_call(lambda: mf.fftconv(u, k, precision=precision), u)
    assert torch.isfinite(y).all()
    assert rel_l2(y, reference(u, k)) <= BUDGETS[precision]


@pytest.mark.parametrize("precision", list(BUDGETS))
@pytest.mark.parametrize("io_dtype", [torch.bfloat16, torch.float16])
def test_kernel_half_io(io_dtype, precision, gen):
    u, k = randn(gen, 3, 4, 4096, device=DEVICE, dtype=io_dtype), randn(gen, 4, 4096, device=DEVICE)
    y = poisoned_call(lambda: mf.fftconv(u, k, precision=precision), u)
    assert y.dtype == io_dtype and torch.isfinite(y).all()
    io_rounding = 2.0 ** -8 if io_dtype == torch.bfloat16 else 2.0 ** -11
    assert rel_l2(y, reference(u, k)) <= BUDGETS[precision] + io_rounding


@pytest.mark.parametrize("precision", list(BUDGETS))
def test_kernel_skip_and_non_contiguous(precision, gen):
    base = randn(gen, 3, 8, 2048, device=DEVICE)
    u = base[:, ::2]  # channel stride 2: the kernel reads strided rows
    k, D = randn(gen, 4, 2048, device=DEVICE), randn(gen, 4, device=DEVICE)
    assert not u.is_contiguous()
    y = poisoned_call(lambda: mf.fftconv(u, k, D=D, precision=precision), u)
    assert rel_l2(y, reference(u, k, D)) <= BUDGETS[precision]


def test_fp32_allclose_at_seed_length(gen):
    u, k = randn(gen, 4, 64, 8192, device=DEVICE), randn(gen, 64, 8192, device=DEVICE)
    y = mf.fftconv(u, k)
    ref = reference(u, k)
    assert rel_l2(y, ref) <= BUDGETS["fp32"]
    assert torch.allclose(y.double(), ref, atol=1e-2, rtol=1e-2)


def assert_sequences_stay_independent(precision: str, gen: torch.Generator) -> None:
    """A NaN and an Inf in two sequences leave every other sequence's output bitwise unchanged."""
    u, k = randn(gen, 4, 3, 8192, device=DEVICE), randn(gen, 3, 8192, device=DEVICE)
    clean = mf.fftconv(u, k, precision=precision)
    u[1, 2, 17] = float("nan")
    u[2, 0, 8000] = float("inf")
    dirty = mf.fftconv(u, k, precision=precision)
    mask = torch.ones(4, 3, dtype=torch.bool)
    mask[1, 2] = mask[2, 0] = False
    assert torch.equal(dirty[mask], clean[mask])


@pytest.mark.parametrize("precision", list(BUDGETS))
def test_kernel_sequences_stay_independent(precision, gen):
    assert_sequences_stay_independent(precision, gen)


def test_fp16_stays_finite_at_seed_scale(gen):
    u, k = randn(gen, 2, 16, 8192, device=DEVICE, dtype=torch.float16), randn(gen, 16, 8192, device=DEVICE)
    assert torch.isfinite(mf.fftconv(u, k, precision="fp16")).all()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_runs_on_the_current_stream(precision, gen):
    side = torch.cuda.Stream()
    u, k = randn(gen, 8, 32, 8192, device=DEVICE), randn(gen, 32, 8192, device=DEVICE)
    expected = mf.fftconv(u, k, precision=precision)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        u2 = u * 1.0  # produced on the side stream: a default-stream launch could race it
        y = mf.fftconv(u2, k, precision=precision)
    side.synchronize()
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


@pytest.mark.parametrize("length, filter_len", [(length, length) for length in KERNEL_LENGTHS] + [(1000, 77), (8191, 1), (12345, 999)])
def test_filter_spectrum_kernel(length, filter_len, gen):
    """The one-launch CUDA filter spectrum is float64 torch.fft's, in the Monarch layout."""
    k = randn(gen, 6, filter_len, device=DEVICE)
    plan = plan_for(length)
    torch.empty(6 * 2 * length * 4, device=DEVICE).fill_(float("nan"))  # poison the next block
    ours = torch.view_as_complex(ops.filter_spectrum(k, length, "bf16"))
    full = torch.fft.fft(k.cpu().double(), n=plan.fft_size) / plan.fft_size
    # The CUDA layout's columns are in natural frequency order: the planner's order for two
    # factors, not its digit reversal for three (N = 32768).
    frequencies = torch.arange(plan.half_rows).unsqueeze(1) + plan.n1 * torch.arange(plan.row_size).unsqueeze(0)
    if len(plan.factors) == 2:
        assert torch.equal(frequencies, spectrum_frequencies(plan))
    want = full[:, frequencies]
    assert ours.shape == want.shape and torch.isfinite(torch.view_as_real(ours)).all()
    assert rel_l2(ours.cpu(), want) <= 1e-6


@pytest.mark.parametrize("length, filter_len", [(length, length) for length in KERNEL_LENGTHS] + [(1000, 77), (8191, 1), (12345, 999)])
def test_two_sided_filter_spectrum_kernel(length, filter_len, gen):
    """A bidirectional filter's spectrum, K_fwd + conj(K_rev), in one launch: float64 torch.fft
    of its whole circle, in the Monarch layout (the halves meet only at lag 0; Lk = L puts the
    last anti-causal tap next to the causal half's padding)."""
    k = randn(gen, 6, 2, filter_len, device=DEVICE)
    plan = plan_for(length)
    torch.empty(6 * 2 * length * 4, device=DEVICE).fill_(float("nan"))  # poison the next block
    ours = torch.view_as_complex(ops.filter_spectrum_two_sided(k, length, "fp32"))
    full = torch.fft.fft(two_sided_circle(k, plan.fft_size)) / plan.fft_size
    frequencies = torch.arange(plan.half_rows).unsqueeze(1) + plan.n1 * torch.arange(plan.row_size).unsqueeze(0)
    want = full[:, frequencies]
    assert ours.shape == want.shape and torch.isfinite(torch.view_as_real(ours)).all()
    assert rel_l2(ours.cpu(), want) <= 1e-6


def test_two_sided_filter_spectrum_four_step(gen):
    """At N >= 65536 (the four-step layout, no two-sided kernel) the op combines the halves'
    spectra: the same values as the causal op's two calls, conjugated and added."""
    k = randn(gen, 3, 2, 97, device=DEVICE)
    ours = ops.filter_spectrum_two_sided(k, 40000, "fp32")
    causal, anti_causal = (ops.filter_spectrum(k[:, h].contiguous(), 40000, "fp32") for h in (0, 1))
    want = torch.view_as_real(torch.view_as_complex(causal) + torch.view_as_complex(anti_causal).conj())
    assert ours.shape == want.shape and rel_l2(ours, want) <= 1e-7


# The backward runs the fused fp32 kernels for every precision: each gradient is held to 1.5x
# the forward budget of the call's precision (the bound), plus the I/O rounding.
GRAD_CASES = [(3, 5, length, length) for length in KERNEL_LENGTHS] + [
    (5, 3, 1000, 77),  # Lk < L, odd sizes
    (1, 7, 8191, 8191),
    (2, 3, 130, 1),  # a one-tap filter
    (17, 2, 300, 299),  # one work item per sequence
    (7, 100, 5000, 4999),  # channels sharing the GPU: chunks of 4 and 3 sequences per channel
    (3, 2, 12345, 3001),  # N = 32768, odd sizes, Lk < L
]
IO_ROUNDING = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def gradients(u, k, D, g, precision):
    """(du, dk, dD) from the package and from float64 autograd of the reference; the
    package's are computed into NaN-poisoned memory, so unwritten elements show."""
    leaves = [t for t in (u, k, D) if t is not None]
    y = mf.fftconv(u, k, D=D, precision=precision)
    torch.empty(4 * (u.numel() + k.numel()), device=DEVICE).fill_(float("nan"))
    ours = torch.autograd.grad(y, leaves, g)
    theirs = torch.autograd.grad(reference(u, k, D), leaves, g.double())
    return ours, theirs


def check_gradients(batch, channels, length, filter_len, precision, budget, gen):
    """du, dk and dD, with and without the skip term, within `budget` of float64 autograd."""
    u = randn(gen, batch, channels, length, device=DEVICE).requires_grad_()
    k = (randn(gen, channels, filter_len, device=DEVICE) / filter_len**0.5).requires_grad_()
    D = randn(gen, channels, device=DEVICE).requires_grad_()
    g = randn(gen, batch, channels, length, device=DEVICE)
    for skip in (D, None):
        ours, theirs = gradients(u, k, skip, g, precision)
        for name, got, want in zip(("du", "dk", "dD"), ours, theirs):
            assert got.shape == want.shape, name
            assert torch.isfinite(got).all(), f"{name}: unwritten (NaN) elements"
            assert rel_l2(got, want) <= budget, (name, skip is None)


@pytest.mark.parametrize("precision", list(BUDGETS))
@pytest.mark.parametrize("batch, channels, length, filter_len", GRAD_CASES)
def test_gradients_every_size(batch, channels, length, filter_len, precision, gen):
    check_gradients(batch, channels, length, filter_len, precision, 1.5 * BUDGETS[precision], gen)


@pytest.mark.parametrize("io_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gradients_half_io_and_strided(io_dtype, precision, gen):
    base = randn(gen, 3, 10, 2048, device=DEVICE, dtype=io_dtype)
    u = base[:, ::2].requires_grad_()  # channel stride 2: the kernels read strided rows
    k = (randn(gen, 5, 2048, device=DEVICE) / 45).requires_grad_()
    D = randn(gen, 5, device=DEVICE).requires_grad_()
    g = randn(gen, 3, 5, 2048, device=DEVICE, dtype=io_dtype)
    ours, theirs = gradients(u, k, D, g, precision)
    assert ours[0].dtype == io_dtype and ours[1].dtype == torch.float32
    for got, want in zip(ours, theirs):
        assert rel_l2(got, want) <= 1.5 * BUDGETS[precision] + 2 * IO_ROUNDING[io_dtype]


def test_gradients_time_strided_input(gen):
    """(B, L, C) data transposed to (B, C, L): not contiguous in time."""
    x = randn(gen, 2, 1500, 3, device=DEVICE)
    u = x.transpose(1, 2).requires_grad_()
    k = (randn(gen, 3, 700, device=DEVICE) / 26).requires_grad_()
    g = randn(gen, 2, 3, 1500, device=DEVICE)
    ours, theirs = gradients(u, k, None, g, "fp32")
    for got, want in zip(ours, theirs):
        assert rel_l2(got, want) <= 1.5 * BUDGETS["fp32"]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gradients_are_deterministic(precision, gen):
    """The same inputs give bitwise the same gradients: no atomics, fixed summation order."""
    u = randn(gen, 16, 8, 4096, device=DEVICE).requires_grad_()
    k = (randn(gen, 8, 4096, device=DEVICE) / 64).requires_grad_()
    D = randn(gen, 8, device=DEVICE).requires_grad_()
    g = randn(gen, 16, 8, 4096, device=DEVICE)
    runs = [torch.autograd.grad(mf.fftconv(u, k, D=D, precision=precision), (u, k, D), g) for _ in range(3)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)


GRAD_ACCUMULATOR_ENV = "MONARCH_FFTCONV_GRAD_ACCUMULATOR"  # read by the binding at each backward call


@pytest.mark.parametrize("batch, channels, length, filter_len", GRAD_CASES)
def test_gradients_scratch_accumulator(batch, channels, length, filter_len, monkeypatch, gen):
    """The scratch route (=global), the benchmark's baseline for the on-chip one, within budget at
    every N (test_gradients_every_size runs the default route)."""
    monkeypatch.setenv(GRAD_ACCUMULATOR_ENV, "global")
    check_gradients(batch, channels, length, filter_len, "fp32", 1.5 * BUDGETS["fp32"], gen)


@pytest.mark.parametrize("batch, channels, length", [(16, 8, 8192), (7, 100, 5000), (4, 3, 300), (5, 2, 16384)])
def test_accumulator_routes_agree(batch, channels, length, monkeypatch, gen):
    """On chip and through the scratch: the same sums in the same order, so equal up to how the
    compiler contracts each route (not asserted bitwise). N = 32768 has no on-chip route: there
    the default must be the scratch route itself, bit for bit."""
    u, grad = randn(gen, batch, channels, length, device=DEVICE), randn(gen, batch, channels, length, device=DEVICE)
    k, D = randn(gen, channels, length, device=DEVICE) / length**0.5, randn(gen, channels, device=DEVICE)
    spectrum = ops.filter_spectrum(k, length, "fp32")
    routes = {}
    for route in ("auto", "global"):
        monkeypatch.setenv(GRAD_ACCUMULATOR_ENV, route)
        routes[route] = ops.fftconv_backward_op(grad, u, spectrum, D, length, "fp32")
    for on_chip, scratch in zip(routes["auto"], routes["global"]):
        assert torch.isfinite(on_chip).all()
        if plan_for(length).fft_size > 16384:
            assert torch.equal(on_chip, scratch)
        else:
            assert rel_l2(on_chip, scratch) <= 1e-6


GRAD_UNIFORM_PAIRS_ENV = "MONARCH_FFTCONV_GRAD_UNIFORM_PAIRS"  # read by the binding at each backward call


@pytest.mark.watchdog(GPU_WATCHDOG_S)  # two grad kernels per case: a hang fails, not stalls
@pytest.mark.parametrize("batch, channels, length", [(16, 8, 8192), (16, 8, 4096), (7, 100, 5000), (4, 3, 300),
                                                     (3, 5, 100), (5, 2, 16384)])
@pytest.mark.parametrize("two_sided", [False, True])
def test_uniform_pair_sweeps_give_the_same_bits(batch, channels, length, two_sided, monkeypatch, gen):
    """The default (=1), thread 0 in the other threads' code path of the grad kernel's pair
    sweeps, and =0, thread 0's own path: the same operations on the same values, so du, dk and
    dD bitwise equal."""
    u, grad = randn(gen, batch, channels, length, device=DEVICE), randn(gen, batch, channels, length, device=DEVICE)
    k, D = randn(gen, channels, length, device=DEVICE) / length**0.5, randn(gen, channels, device=DEVICE)
    spectrum = ops.filter_spectrum(k, length, "fp32")
    backward = ops.fftconv_backward_two_sided_op if two_sided else ops.fftconv_backward_op
    runs = {}
    for choice in ("0", "1"):
        monkeypatch.setenv(GRAD_UNIFORM_PAIRS_ENV, choice)
        runs[choice] = backward(grad, u, spectrum, D, length, "fp32")
    for own_path, uniform in zip(runs["0"], runs["1"]):
        assert torch.isfinite(uniform).all()
        assert torch.equal(own_path, uniform)


@pytest.mark.watchdog(GPU_WATCHDOG_S)  # a refused choice must not launch; if it did, a hang fails, not stalls
@pytest.mark.parametrize("env, value, message", [
    (GRAD_ACCUMULATOR_ENV, "onchip", "MONARCH_FFTCONV_GRAD_ACCUMULATOR must be 'auto' or 'global'"),
    (GRAD_UNIFORM_PAIRS_ENV, "yes", "MONARCH_FFTCONV_GRAD_UNIFORM_PAIRS must be '1' or '0'"),
    ("MONARCH_FFTCONV_GRAD_SPLIT", "on", "MONARCH_FFTCONV_GRAD_SPLIT must be '1' or '0'"),
])
def test_an_unknown_backward_choice_is_refused(env, value, message, monkeypatch, gen):
    u, k = randn(gen, 2, 3, 1000, device=DEVICE), randn(gen, 3, 1000, device=DEVICE)
    spectrum = ops.filter_spectrum(k, 1000, "fp32")
    monkeypatch.setenv(env, value)
    with pytest.raises(ValueError, match=message):
        ops.fftconv_backward_op(u, u, spectrum, None, 1000, "fp32")


GRAD_SPLIT_ENV = "MONARCH_FFTCONV_GRAD_SPLIT"  # read by the binding at each backward call
SPLIT_KERNEL = "fftconv_fp32_filter_sums_kernel"


def kernels_launched(fn) -> list[str]:
    """The CUDA kernels fn launches (torch.profiler), by name, a name for each launch."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [event.name for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.watchdog(GPU_WATCHDOG_S)  # a new kernel (the filter sums alone): a hang fails, not stalls
@pytest.mark.parametrize("batch, channels, groups, length, filter_len, io_dtype", [
    (3, 4, 4, 12345, 3001, torch.float32),  # N = 32768, odd sizes, Lk < L
    (2, 6, 3, 16384, 16384, torch.float32),  # grouped (2 channels a row: read by shift), the whole length
    (2, 9, 3, 12000, 5000, torch.float32),  # grouped, 3 channels a row: repeated rows
    (5, 3, 3, 9000, 1, torch.bfloat16),  # a one-tap filter, 2-byte I/O
    (2, 2, 2, 4097, 999, torch.float16),  # N = 16384: no split there, the fused kernel
    (3, 160, 160, 12345, 3001, torch.float32),  # C > SMs: a work item sums several sequences
    (2, 5, 5, 10001, 7777, "strided"),  # fp32 u strided over channels (a slice of a wider tensor)
])
def test_split_backward_against_float64(batch, channels, groups, length, filter_len, io_dtype, monkeypatch, gen):
    """MONARCH_FFTCONV_GRAD_SPLIT=1: at N = 32768 the grad kernel's filter sums alone and du by the
    forward kernel on the conjugated spectrum. du, dk (plain and two-sided), dD against float64,
    with and without the skip term; within the fp32 budget of the fused backward's results;
    deterministic; the uniform pair sweeps (the default) and thread 0's own path give the same
    bits; the filter sums kernel runs (profiler) at N = 32768 and nowhere else, where the switch
    changes nothing: the same bits as the fused call. With C above the SM count a work item walks
    several sequences (the accumulator's read-modify-write, the barrier between iterations). A u
    strided over channels, and the two-sided op's du, take the same route."""
    strided = io_dtype == "strided"
    io_dtype = torch.float32 if strided else io_dtype
    u = randn(gen, batch, channels + strided, length, device=DEVICE).to(io_dtype)[:, int(strided):]
    assert u.is_contiguous() != strided
    grad = randn(gen, batch, channels, length, device=DEVICE).to(io_dtype)
    k, D = randn(gen, groups, filter_len, device=DEVICE) / filter_len**0.5, randn(gen, channels, device=DEVICE)
    per_channel = k.repeat_interleave(channels // groups, dim=0).double()
    spectrum = ops.filter_spectrum(k, length, "fp32")
    n = 2 * length
    g64, u64 = grad.double(), u.double()
    circle = torch.fft.irfft(torch.fft.rfft(g64, n=n) * torch.fft.rfft(u64, n=n).conj(), n=n).sum(0)
    lags = torch.arange(filter_len, device=DEVICE)
    want_dk = circle[:, lags].unflatten(0, (groups, channels // groups)).sum(1)
    want_rev = circle[:, (n - lags) % n].unflatten(0, (groups, channels // groups)).sum(1)
    budget = 1.5 * BUDGETS["fp32"] + 2 * IO_ROUNDING[io_dtype]
    for skip in (D, None):
        want_du = torch.fft.irfft(torch.fft.rfft(g64, n=n) * torch.fft.rfft(per_channel, n=n).conj(), n=n)[..., :length]
        if skip is not None:
            want_du = want_du + skip.double()[:, None] * g64
        monkeypatch.setenv(GRAD_SPLIT_ENV, "1")
        split = poisoned_call(lambda: ops.fftconv_backward_op(grad, u, spectrum, skip, filter_len, "fp32"), u)
        launched = kernels_launched(lambda: ops.fftconv_backward_op(grad, u, spectrum, skip, filter_len, "fp32"))
        assert any(SPLIT_KERNEL in name for name in launched) == (n > 16384), sorted(launched)
        again = ops.fftconv_backward_op(grad, u, spectrum, skip, filter_len, "fp32")
        du2, dk2, _ = ops.fftconv_backward_two_sided_op(grad, u, spectrum, skip, filter_len, "fp32")
        monkeypatch.setenv(GRAD_UNIFORM_PAIRS_ENV, "0")  # the filter sums with thread 0's own path
        own_path = ops.fftconv_backward_op(grad, u, spectrum, skip, filter_len, "fp32")
        monkeypatch.delenv(GRAD_UNIFORM_PAIRS_ENV)
        monkeypatch.setenv(GRAD_SPLIT_ENV, "0")
        fused = ops.fftconv_backward_op(grad, u, spectrum, skip, filter_len, "fp32")
        du, dk, dskip = split
        assert du.dtype == io_dtype and torch.isfinite(du).all() and torch.isfinite(dk).all()
        assert rel_l2(du, want_du) <= budget and rel_l2(dk, want_dk) <= 1.5 * BUDGETS["fp32"]
        assert rel_l2(dk2[:, 0], want_dk) <= 1.5 * BUDGETS["fp32"] and rel_l2(dk2[:, 1], want_rev) <= 1.5 * BUDGETS["fp32"]
        assert rel_l2(du2, want_du) <= budget  # the two-sided op's du: the same split route (a causal spectrum here)
        if skip is not None:
            assert rel_l2(dskip, (u64 * g64).sum((0, 2))) <= 1.5 * BUDGETS["fp32"]
        assert all(torch.equal(a, b) for a, b in zip(split, again))
        assert all(torch.equal(a, b) for a, b in zip(split, own_path))  # the same sums: only the control flow differs
        if n <= 16384:
            assert all(torch.equal(a, b) for a, b in zip(split, fused))
        else:
            assert rel_l2(du, fused[0]) <= budget and rel_l2(dk, fused[1]) <= 1.5 * BUDGETS["fp32"]


@pytest.mark.watchdog(GPU_WATCHDOG_S)
@pytest.mark.parametrize("gates", ["both", "pregate", "postgate"])
@pytest.mark.parametrize("batch, channels, length", [(2, 3, 10000), (3, 160, 10000), (2, 3, 3000)])
def test_split_backward_of_the_gated_step(gates, batch, channels, length, monkeypatch, gen):
    """The gated step under MONARCH_FFTCONV_GRAD_SPLIT=1: the filter sums of x = pregate ⊙ u and
    dz = postgate ⊙ dy, then the forward kernel with its gates swapped (dz its load; with a
    pregate, y = u ⊙ dx = dpregate and z = dx, then du = pregate ⊙ dx). du, dk, dD, dpregate
    against float64 autograd and within the fp32 budget of the fused gated kernel's; where the
    split does not apply (N = 8192), the same bits. u strided over channels (the forward's gate
    is then a contiguous copy of it); C = 160 > SMs: several sequences a work item."""
    base, grad, pre, post = (randn(gen, batch, channels, length, device=DEVICE) for _ in range(4))
    u = torch.cat([base, base], dim=1)[:, ::2]  # channel stride 2
    pre = pre if gates in ("both", "pregate") else None
    post = post if gates in ("both", "postgate") else None
    k, D = randn(gen, channels, length // 2, device=DEVICE) / 70, randn(gen, channels, device=DEVICE)
    spectrum = ops.filter_spectrum(k, length, "fp32")
    runs = {}
    for choice in ("1", "0"):
        monkeypatch.setenv(GRAD_SPLIT_ENV, choice)
        runs[choice] = ops.gated_fftconv_backward_op(grad, u, spectrum, D, pre, post, k.shape[-1], "fp32")
    launched = kernels_launched(lambda: ops.gated_fftconv_backward_op(grad, u, spectrum, D, pre, post, k.shape[-1],
                                                                      "fp32"))
    assert not any(SPLIT_KERNEL in name for name in launched)  # the switch is "0" now
    monkeypatch.setenv(GRAD_SPLIT_ENV, "1")
    launched = kernels_launched(lambda: ops.gated_fftconv_backward_op(grad, u, spectrum, D, pre, post, k.shape[-1],
                                                                      "fp32"))
    assert any(SPLIT_KERNEL in name for name in launched) == (length > 8192), sorted(launched)
    leaves = [t.double().requires_grad_() for t in (u, k, D)] + ([pre.double().requires_grad_()] if pre is not None else [])
    u64, k64, D64 = leaves[:3]
    x = u64 * leaves[3] if pre is not None else u64
    z = reference(x, k64, D64)
    y = z * post.double() if post is not None else z
    want = torch.autograd.grad(y, leaves, grad.double())
    split, fused = runs["1"], runs["0"]
    got = list(split[:3]) + ([split[3]] if pre is not None else [])
    for name, a, w in zip(("du", "dk", "dD", "dpregate"), got, want):
        assert torch.isfinite(a).all() and rel_l2(a, w) <= 1.5 * BUDGETS["fp32"], name
    if length > 8192:
        assert all(rel_l2(a, b) <= 1.5 * BUDGETS["fp32"] for a, b in zip(split, fused) if a.numel())
    else:
        assert all(torch.equal(a, b) for a, b in zip(split, fused))


FWD_UNIFORM_PAIRS_ENV = "MONARCH_FFTCONV_FWD_UNIFORM_PAIRS"  # read by the binding at each fp32 forward call


@pytest.mark.watchdog(GPU_WATCHDOG_S)  # six forward calls per case: a hang fails, not stalls
@pytest.mark.parametrize("batch, channels, length, filter_len", [
    (16, 8, 4096, 4096), (16, 8, 8192, 8192), (7, 100, 5000, 4999), (3, 5, 1001, 333), (4, 3, 513, 513),
    (2, 3, 16384, 16384), (3, 5, 100, 100)])  # N = 8192, 16384, 16384, 2048, 2048, 32768, 256 (not built: thread 0's path)
@pytest.mark.parametrize("io_dtype", [torch.float32, torch.bfloat16])
def test_forward_uniform_pairs_give_the_same_bits(batch, channels, length, filter_len, io_dtype, monkeypatch, gen):
    """The default (=1, thread 0 in the other threads' code path of the fp32 forward kernel's mid
    pass) against =0, thread 0's own path: the same operations on the
    same values, so y bitwise equal: plain, gated (both gates) and the training step's gated forward
    (y and z). Odd lengths, Lk < L and D included."""
    u = randn(gen, batch, channels, length, device=DEVICE).to(io_dtype)
    pregate = randn(gen, batch, channels, length, device=DEVICE).to(io_dtype)
    postgate = randn(gen, batch, channels, length, device=DEVICE).to(io_dtype)
    k, D = randn(gen, channels, filter_len, device=DEVICE) / filter_len**0.5, randn(gen, channels, device=DEVICE)
    spectrum = ops.filter_spectrum(k, length, "fp32")
    runs = {}
    for choice in ("0", "1"):
        monkeypatch.setenv(FWD_UNIFORM_PAIRS_ENV, choice)
        runs[choice] = [ops.conv_forward_op(u, spectrum, D, "fp32"),
                        ops.gated_conv_forward_op(u, spectrum, D, pregate, postgate, "fp32")]
        if io_dtype == torch.float32:  # the fused training step's forward: fp32 io (it stores z)
            runs[choice] += ops.gated_fftconv_op(u, k, D, pregate, postgate, "fp32")[:2]
    for own_path, uniform in zip(runs["0"], runs["1"]):
        assert torch.isfinite(uniform).all()
        assert torch.equal(own_path, uniform)


@pytest.mark.watchdog(GPU_WATCHDOG_S)
@pytest.mark.parametrize("channels, filter_len, length", [(256, 4096, 4096), (7, 333, 1001), (5, 8191, 8192),
                                                          (3, 100, 100), (2, 9000, 16384), (2, 9000, 40000)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_filter_gives_its_fp32_values_bits(channels, filter_len, length, dtype, gen):
    """A bf16/fp16 k goes to the radix spectrum kernel as it is (each tap widened as it is
    loaded: exact; N <= 32768, the radix sizes), or is cast first (N = 131072, four-step): the
    spectrum is bitwise that of the same values in fp32 and of a strided half k (cast first), and
    so is a bf16-I/O call's y."""
    k = (randn(gen, channels, filter_len, device=DEVICE) / filter_len**0.5).to(dtype)
    u = randn(gen, 3, channels, length, device=DEVICE).to(dtype)
    spectrum = ops.filter_spectrum(k, length, "fp32")
    assert torch.isfinite(spectrum).all()
    assert torch.equal(spectrum, ops.filter_spectrum(k.float(), length, "fp32"))
    strided = torch.stack([k, torch.zeros_like(k)], dim=-1)[..., 0]  # the same values, stride 2
    assert torch.equal(spectrum, ops.filter_spectrum(strided, length, "fp32"))
    y = mf.fftconv(u, k)
    assert torch.equal(y, mf.fftconv(u, strided))
    assert rel_l2(y, reference(u, k)) <= 1e-2  # y rounded to the 2-byte io type


@pytest.mark.watchdog(GPU_WATCHDOG_S)  # a refused choice must not launch; if it did, a hang fails, not stalls
def test_an_unknown_forward_choice_is_refused(monkeypatch, gen):
    u, k = randn(gen, 2, 3, 1000, device=DEVICE), randn(gen, 3, 1000, device=DEVICE)
    spectrum = ops.filter_spectrum(k, 1000, "fp32")
    monkeypatch.setenv(FWD_UNIFORM_PAIRS_ENV, "yes")
    with pytest.raises(ValueError, match="MONARCH_FFTCONV_FWD_UNIFORM_PAIRS must be '1' or '0'"):
        ops.conv_forward_op(u, spectrum, None, "fp32")


@pytest.mark.watchdog(GPU_WATCHDOG_S)  # a refused choice must not launch; if it did, a hang fails, not stalls
def test_an_unknown_tensor_core_kernel_is_refused_by_the_binding(monkeypatch, gen):
    """The binding refuses a MONARCH_FFTCONV_TC_KERNEL it does not know before it launches (the
    op called directly, past the Python decision)."""
    u, k = randn(gen, 2, 3, 8192, device=DEVICE), randn(gen, 3, 8192, device=DEVICE)
    spectrum = ops.filter_spectrum(k, 8192, "bf16")
    monkeypatch.setenv("MONARCH_FFTCONV_TC_KERNEL", "sm90")
    with pytest.raises(ValueError, match="MONARCH_FFTCONV_TC_KERNEL must be 'engine' or 'mma' or unset, got 'sm90'"):
        ops.conv_forward_op(u, spectrum, None, "bf16")


@pytest.mark.parametrize("io_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("batch, channels, length", [(16, 8, 8192), (7, 5, 4999), (3, 3, 301), (2, 3, 4096)])
def test_half_io_backward_reads_what_fp32_io_reads(io_dtype, batch, channels, length, gen):
    """A 16-bit u and dy are widened exactly, so the backward on them is the fp32-I/O backward
    on their widened values: dk and dD alike up to the compiler's contraction, du up to its own
    rounding to io_dtype. Odd lengths and odd row offsets take the element-wise loads."""
    u = randn(gen, batch, channels, length, device=DEVICE).to(io_dtype)
    grad = randn(gen, batch, channels, length, device=DEVICE).to(io_dtype)
    k, D = randn(gen, channels, length, device=DEVICE) / length**0.5, randn(gen, channels, device=DEVICE)
    spectrum = ops.filter_spectrum(k, length, "fp32")
    # Words the kernel carries in float registers before widening: a zero at every odd t makes
    # each pair's 32-bit word a float denormal (or zero), an inf at odd t a NaN pattern; they
    # must come through bit for bit.
    u[..., 1::2] = 0
    grad[..., 1::4] = 0
    half = ops.fftconv_backward_op(grad, u, spectrum, D, length, "fp32")
    wide = ops.fftconv_backward_op(grad.float(), u.float(), spectrum, D, length, "fp32")
    assert half[0].dtype == io_dtype
    assert rel_l2(half[0].float(), wide[0]) <= IO_ROUNDING[io_dtype]
    for got, want in zip(half[1:], wide[1:]):
        assert rel_l2(got, want) <= 1e-6
    u[0, 0, 1] = float("inf")  # the word of pair (0, 1) is then an fp32 NaN pattern: the inf must reach dk[0]
    _, dk, _ = ops.fftconv_backward_op(grad, u, spectrum, D, length, "fp32")
    assert not torch.isfinite(dk[0]).all() and torch.isfinite(dk[1:]).all()


@pytest.mark.parametrize("batch, channels, length, filter_len", [(3, 5, 8192, 8192), (7, 100, 5000, 4999),
                                                                 (2, 3, 300, 77), (2, 3, 12345, 3001),
                                                                 (1, 2, 40000, 39999)])
def test_two_sided_backward_on_the_kernels(batch, channels, length, filter_len, gen):
    """The two-sided filter gradient (lags s and -s from one correlation) against float64, at
    the radix kernels' N (on chip, N = 32768's scratch route) and the four-step one."""
    u, grad = randn(gen, batch, channels, length, device=DEVICE), randn(gen, batch, channels, length, device=DEVICE)
    k, D = randn(gen, channels, filter_len, device=DEVICE) / filter_len**0.5, randn(gen, channels, device=DEVICE)
    spectrum = ops.filter_spectrum(k, length, "fp32")
    du, dk, dskip = poisoned_call(lambda: ops.fftconv_backward_two_sided_op(grad, u, spectrum, D, filter_len, "fp32"), u)
    du_causal, dk_causal, dskip_causal = ops.fftconv_backward_op(grad, u, spectrum, D, filter_len, "fp32")
    n = 2 * length
    circle = torch.fft.irfft(torch.fft.rfft(grad.double(), n=n) * torch.fft.rfft(u.double(), n=n).conj(), n=n).sum(0)
    lags = torch.arange(filter_len, device=DEVICE)
    assert dk.shape == (channels, 2, filter_len) and torch.isfinite(dk).all()
    assert rel_l2(dk[:, 0], circle[:, lags]) <= 1.5 * BUDGETS["fp32"]
    assert rel_l2(dk[:, 1], circle[:, (n - lags) % n]) <= 1.5 * BUDGETS["fp32"]
    assert rel_l2(dk[:, 0], dk_causal) <= 1e-6
    assert torch.equal(du, du_causal) and torch.equal(dskip, dskip_causal)


@pytest.mark.watchdog(GPU_WATCHDOG_S)  # rows by shift, written in session 37 without a GPU: a hang fails, not stalls
@pytest.mark.parametrize("route", ["auto", "global"])
@pytest.mark.parametrize("batch, channels, groups, length, precision", [(3, 12, 3, 8192, "fp32"), (5, 8, 2, 1000, "fp32"),
                                                                        (2, 6, 1, 12345, "fp32"), (2, 6, 3, 40000, "fp32"),
                                                                        (3, 8, 4, 777, "bf16"), (2, 9, 3, 3001, "fp32"),
                                                                        (4, 64, 2, 8191, "fp32"), (3, 8, 2, 200, "fp32")])
def test_grouped_spectrum_on_the_kernels(route, batch, channels, groups, length, precision, monkeypatch, gen):
    """A G-row spectrum on the CUDA ops: the ungated fp32 radix kernels read its rows by shift
    where C/G is a power of two (4, 4, 32 and 4 channels a row here, the last at N = 512 where the
    forward's own-path instance runs; the bf16 case's fp32 backward reads by shift 1), the binding
    repeats them for 3 channels a row and for the four-step and tensor-core kernels; each
    group's filter gradient is summed.
    Both accumulator routes (N up to 32768). y, du, dk (G rows, plain and two-sided) and dD
    against float64; bitwise the same on a second call; the shifted read gives the repeated
    rows' bits."""
    monkeypatch.setenv(GRAD_ACCUMULATOR_ENV, route)
    filter_len = max(1, length // 3)
    u, grad = randn(gen, batch, channels, length, device=DEVICE), randn(gen, batch, channels, length, device=DEVICE)
    k, D = randn(gen, groups, filter_len, device=DEVICE) / filter_len**0.5, randn(gen, channels, device=DEVICE)
    spectrum = ops.filter_spectrum(k, length, precision)
    per_channel = k.repeat_interleave(channels // groups, dim=0)
    y = poisoned_call(lambda: ops.conv_forward_op(u, spectrum, D, precision), u)
    assert rel_l2(y, reference(u, per_channel, D)) <= BUDGETS[precision]
    n = 2 * length
    circle = torch.fft.irfft(torch.fft.rfft(grad.double(), n=n) * torch.fft.rfft(u.double(), n=n).conj(), n=n).sum(0)
    lags = torch.arange(filter_len, device=DEVICE)
    want_dk = circle[:, lags].unflatten(0, (groups, channels // groups)).sum(1)
    want_rev = circle[:, (n - lags) % n].unflatten(0, (groups, channels // groups)).sum(1)
    want_du = torch.fft.irfft(torch.fft.rfft(grad.double(), n=n) * torch.fft.rfft(per_channel.double(), n=n).conj(),
                              n=n)[..., :length] + D.double()[:, None] * grad.double()
    first = ops.fftconv_backward_op(grad, u, spectrum, D, filter_len, precision)
    du, dk, dskip = first
    assert dk.shape == (groups, filter_len) and torch.isfinite(dk).all()
    assert rel_l2(du, want_du) <= 1.5 * BUDGETS["fp32"] and rel_l2(dk, want_dk) <= 1.5 * BUDGETS["fp32"]
    assert rel_l2(dskip, (u.double() * grad.double()).sum((0, 2))) <= 1.5 * BUDGETS["fp32"]
    assert all(torch.equal(a, b) for a, b in zip(first, ops.fftconv_backward_op(grad, u, spectrum, D, filter_len, precision)))
    _, dk2, _ = ops.fftconv_backward_two_sided_op(grad, u, spectrum, D, filter_len, precision)
    assert rel_l2(dk2[:, 0], want_dk) <= 1.5 * BUDGETS["fp32"] and rel_l2(dk2[:, 1], want_rev) <= 1.5 * BUDGETS["fp32"]
    # The same call on the rows repeated by hand (a row per channel, shift 0): the same bits.
    repeated = spectrum.repeat_interleave(channels // groups, dim=0)
    assert torch.equal(y, ops.conv_forward_op(u, repeated, D, precision))
    du_r, dk_r, dskip_r = ops.fftconv_backward_op(grad, u, repeated, D, filter_len, precision)
    assert torch.equal(du, du_r) and torch.equal(dskip, dskip_r)
    assert torch.equal(dk, dk_r.unflatten(0, (groups, channels // groups)).sum(1))


@pytest.mark.watchdog(GPU_WATCHDOG_S)  # rows by shift, written in session 37 without a GPU: a hang fails, not stalls
@pytest.mark.parametrize("io_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("uniform_pairs", ["0", "1"])
@pytest.mark.parametrize("batch, channels, groups, length", [(3, 8, 2, 1000), (2, 16, 1, 9000), (2, 4, 2, 300)])
def test_grouped_rows_by_shift_give_the_repeated_rows_bits(batch, channels, groups, length, io_dtype, uniform_pairs,
                                                           monkeypatch, gen):
    """The fp32 radix kernels on a G-row spectrum with C/G a power of two (read by shift) give
    the bits of the same call on the rows repeated to one per channel: y, du, dk (summed per
    group) and dD, for 2-byte u (the bf16/fp16 instances) and fp32 u, on the uniform pair sweep
    and thread 0's own path (MONARCH_FFTCONV_FWD_UNIFORM_PAIRS / _GRAD_UNIFORM_PAIRS)."""
    monkeypatch.setenv("MONARCH_FFTCONV_FWD_UNIFORM_PAIRS", uniform_pairs)
    monkeypatch.setenv("MONARCH_FFTCONV_GRAD_UNIFORM_PAIRS", uniform_pairs)
    filter_len = max(1, length // 2 + 1)
    u = randn(gen, batch, channels, length, device=DEVICE).to(io_dtype)
    grad = randn(gen, batch, channels, length, device=DEVICE).to(io_dtype)
    k, D = randn(gen, groups, filter_len, device=DEVICE), randn(gen, channels, device=DEVICE)
    spectrum = ops.filter_spectrum(k, length, "fp32")
    repeated = spectrum.repeat_interleave(channels // groups, dim=0)
    y = ops.conv_forward_op(u, spectrum, D, "fp32")
    assert torch.equal(y, ops.conv_forward_op(u, repeated, D, "fp32"))
    assert rel_l2(y, reference(u.float(), k.repeat_interleave(channels // groups, dim=0), D)) <= 2 * BUDGETS["fp32"] + (
        0 if io_dtype == torch.float32 else 1e-2)
    du, dk, dskip = ops.fftconv_backward_op(grad, u, spectrum, D, filter_len, "fp32")
    du_r, dk_r, dskip_r = ops.fftconv_backward_op(grad, u, repeated, D, filter_len, "fp32")
    assert torch.equal(du, du_r) and torch.equal(dskip, dskip_r)
    assert dk.shape == (groups, filter_len)
    assert torch.equal(dk, dk_r.unflatten(0, (groups, channels // groups)).sum(1))


def test_double_backward_is_refused_with_a_clear_error(gen):
    """The backward op has no derivative: create_graph=True fails loudly, never silently."""
    u = randn(gen, 2, 3, 1000, device=DEVICE).requires_grad_()
    k = randn(gen, 3, 1000, device=DEVICE).requires_grad_()
    y = mf.fftconv(u, k)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        torch.autograd.grad(y.square().sum(), (u,), create_graph=True)


def test_conv_forward_op_refuses_inputs_that_need_gradients(gen):
    """conv_forward (the module's inference path) is not differentiable: with a u that needs
    a gradient it raises; without autograd it runs."""
    u, k = randn(gen, 2, 3, 1000, device=DEVICE), randn(gen, 3, 1000, device=DEVICE)
    spectrum = ops.filter_spectrum(k, 1000, "fp32")
    with pytest.raises(RuntimeError, match="not differentiable"):
        ops.conv_forward(u.clone().requires_grad_(), spectrum, None, "fp32")
    with torch.no_grad():
        y = ops.conv_forward(u.clone().requires_grad_(), spectrum, None, "fp32")
    assert rel_l2(y, reference(u, k)) <= BUDGETS["fp32"]


def test_gated_ops_take_the_cpp_autograd_kernel(gen):
    """gated_conv_forward (gated inference) and gated_fftconv (the gated training step's forward)
    have C++ kernels at AutogradCUDA, as conv_forward does (no Python shim a call): each refuses
    a u that needs a gradient with grad mode on and, below it, gives the gated convolution."""
    B, C, L = 2, 3, 999
    u, k, skip = randn(gen, B, C, L, device=DEVICE), randn(gen, C, L, device=DEVICE), randn(gen, C, device=DEVICE)
    pre, post = randn(gen, B, C, L, device=DEVICE), randn(gen, B, C, L, device=DEVICE)
    for op in ("gated_conv_forward", "gated_fftconv"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"monarch_fftconv::{op}", "AutogradCUDA"), op
    expected = post * (reference(pre * u, k) + skip[:, None] * pre * u)
    spectrum = ops.filter_spectrum(k, L, "fp32")
    with pytest.raises(RuntimeError, match="gated_conv_forward is not differentiable"):
        ops.gated_conv_forward_op(u.clone().requires_grad_(), spectrum, skip, pre, post, "fp32")
    with pytest.raises(RuntimeError, match="gated_fftconv is not differentiable"):
        ops.gated_fftconv_op(u, k.clone().requires_grad_(), skip, pre, post, "fp32")
    with torch.no_grad():
        y = ops.gated_conv_forward_op(u.clone().requires_grad_(), spectrum, skip, pre, post, "fp32")
        y2, z, _ = ops.gated_fftconv_op(u, k.clone().requires_grad_(), skip, pre, post, "fp32")
    assert rel_l2(y, expected) <= BUDGETS["fp32"] and rel_l2(y2, expected) <= BUDGETS["fp32"]
    assert rel_l2(post * z, expected) <= BUDGETS["fp32"]


def test_inference_cache_keeps_an_entry_per_stream(gen):
    """Inside inference_cache() a CUDA layer's spectra are kept per stream (a refresh on one
    stream never races a convolution reading the spectrum on another): a call on a side stream
    makes a second entry, keyed by that stream's id as torch.cuda.Stream reports it (the cache asks
    torch._C for the id alone), and both streams' outputs are the uncached call's."""
    layer = mf.FFTConv(8, 1000).to(DEVICE)
    x = randn(gen, 2, 8, 1000, device=DEVICE)
    with torch.no_grad():
        expected = layer(x)
        side = torch.cuda.Stream()
        with mf.inference_cache(layer):
            on_default = layer(x)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                on_side = layer(x)
            torch.cuda.current_stream().wait_stream(side)
            streams = {key[-1] for key in layer._spectra.entries}
    assert streams == {torch.cuda.current_stream().stream_id, side.stream_id}
    assert torch.equal(on_default, expected) and torch.equal(on_side, expected)


def test_refresh_takes_the_cpp_autograd_kernel(gen):
    """refresh_filter_spectrum (inference_cache's call) has a C++ kernel at AutogradCUDA: it
    refuses written buffers that need a gradient with grad mode on, takes a filter that needs
    one and records nothing (as the CPU reference), bumps the versions of the two buffers it
    writes, as the ADInplaceOrView step it skips would, and brings the spectrum up to date."""
    C, L = 5, 777
    assert torch._C._dispatch_has_kernel_for_dispatch_key("monarch_fftconv::refresh_filter_spectrum", "AutogradCUDA")
    k = randn(gen, C, L, device=DEVICE)
    source = k.clone()
    spectrum = ops.filter_spectrum(source, L, "fp32")
    with pytest.raises(RuntimeError, match="refresh_filter_spectrum is not differentiable"):
        ops.refresh_filter_spectrum_op(k, source.clone().requires_grad_(), spectrum, L, "fp32")
    changed = k.clone()
    changed[2] += randn(gen, L, device=DEVICE)
    versions = source._version, spectrum._version
    ops.refresh_filter_spectrum_op(changed.requires_grad_(), source, spectrum, L, "fp32")
    changed = changed.detach()
    assert not (source.requires_grad or spectrum.requires_grad)
    assert source._version > versions[0] and spectrum._version > versions[1]
    assert torch.equal(source, changed)
    assert torch.equal(spectrum, ops.filter_spectrum(changed, L, "fp32"))


def test_module_sees_filter_writes_and_caches_on_request_on_gpu(gen):
    """At the fused kernels' largest Monarch size: a write through `.data` (no version bump) is
    seen by the next call; inside inference_cache() the cached spectrum gives the same result."""
    conv = mf.FFTConv(16, 8192).to(DEVICE)
    x = randn(gen, 2, 16, 8192, device=DEVICE)
    with torch.no_grad():
        first = conv(x)
        conv.filter.data.add_(1.0)
        second = conv(x)
        with mf.inference_cache(conv):
            cached = [conv(x) for _ in range(2)]
    assert rel_l2(first, reference(x, conv.filter - 1.0)) <= BUDGETS["fp32"]
    assert rel_l2(second, reference(x, conv.filter)) <= BUDGETS["fp32"]
    assert all(rel_l2(y, reference(x, conv.filter)) <= BUDGETS["fp32"] for y in cached)


@pytest.mark.parametrize("backend", ["auto", "portable"])
def test_64bit_indexing(backend, monkeypatch, gen):
    """More than 2**31 elements: 32-bit offsets would wrap and corrupt the last sequences. A bf16
    call this large takes the fp32 kernel; through the ops ("portable") the tensor-core kernel."""
    monkeypatch.setenv(BACKEND_ENV, backend)
    channels, length = 4, 8192
    batch = 2**31 // (channels * length) + 1
    u = torch.empty(batch, channels, length, device=DEVICE, dtype=torch.bfloat16).normal_()
    k = randn(gen, channels, 16, device=DEVICE)
    y = mf.fftconv(u, k, precision="bf16")
    tail = slice(batch - 2, batch)
    assert rel_l2(y[tail], reference(u[tail], k)) <= BUDGETS["bf16"] + 2.0 ** -8
    del u, y
    torch.cuda.empty_cache()


def test_transposed_input(gen):
    """(B, L, C) activations transposed to (B, C, L): time is strided, the result is right."""
    x = randn(gen, 2, 3000, 6, device=DEVICE)
    k = randn(gen, 6, 3000, device=DEVICE)
    u = x.transpose(1, 2)
    assert u.stride(-1) != 1
    for precision in ("fp32", "bf16"):
        assert rel_l2(mf.fftconv(u, k, precision=precision), reference(u, k)) <= BUDGETS[precision]


def test_the_cuda_op_is_the_extensions(gen):
    """The CUDA kernels of every op come from the binding, on the same ops as the CPU ones."""
    u, k = randn(gen, 2, 3, 1000, device=DEVICE), randn(gen, 3, 1000, device=DEVICE)
    mf.fftconv(u, k)  # loads the extension
    for op in ("filter_spectrum", "conv_forward", "fftconv", "fftconv_backward", "fftconv_backward_two_sided"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"monarch_fftconv::{op}", "CUDA"), op
    spectrum = ops.filter_spectrum(k, 1000, "fp32")
    y = torch.ops.monarch_fftconv.conv_forward(u, spectrum, None, "fp32")
    assert rel_l2(y, reference(u, k)) <= BUDGETS["fp32"]


def test_portable_first_call_in_a_fresh_process():
    """MONARCH_FFTCONV_BACKEND=portable as a process's first CUDA call runs the ops' kernels:
    the decision loads the extension that registers them (session 10's profile script died
    here with NotImplementedError)."""
    import os
    import subprocess
    import sys

    script = (
        "import torch, monarch_fftconv as mf\n"
        "from helpers import reference, rel_l2\n"
        "u = torch.randn(2, 3, 1000, device='cuda'); k = torch.randn(3, 1000, device='cuda')\n"
        "y = mf.fftconv(u, k, precision='bf16')\n"
        "print(rel_l2(y, reference(u, k)), mf.explain(u, k, precision='bf16')['backend'])\n"
    )
    tests_dir = os.path.dirname(os.path.abspath(__file__))  # for helpers
    path = os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, BACKEND_ENV: "portable", "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    error, backend = done.stdout.split()[-2:]
    assert backend == "portable" and float(error) <= BUDGETS["bf16"]


def test_the_binding_raises_on_bad_direct_calls():
    """Called directly, the CUDA op rejects a spectrum whose plan does not fit L, and an
    unknown precision, with a Python ValueError. In a subprocess: a crash must not take the
    test session down. (Until session 20 the first killed the process: a message with a
    number in it went through the library's own copy of ostream::_M_insert<long>; binding.cpp,
    `message`. The fix has not yet run on a GPU.)"""
    import subprocess
    import sys

    code = (
        "import torch, monarch_fftconv as mf\n"
        "from monarch_fftconv import ops\n"
        "u, k = torch.randn(2, 3, 1000, device='cuda'), torch.randn(3, 1000, device='cuda')\n"
        "mf.fftconv(u, k)\n"
        "spectrum = ops.filter_spectrum(k, 1000, 'fp32')\n"
        "for args in ((u[..., :400], 'fp32'), (u, 'fp8')):\n"
        "    try:\n"
        "        torch.ops.monarch_fftconv.conv_forward(args[0], spectrum, None, args[1])\n"
        "    except ValueError as e:\n"
        "        print('ValueError', str(e).splitlines()[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and "does not fit L" in lines[0] and "unknown precision" in lines[1], lines


def test_explain_never_builds_and_then_names_the_kernel():
    """In a fresh process explain() says "pending" (it never builds); after one call it names
    the kernel the call took."""
    import subprocess
    import sys

    code = (
        "import torch, monarch_fftconv as mf\n"
        "u, k = torch.randn(2, 3, 1000, device='cuda'), torch.randn(3, 1000, device='cuda')\n"
        "before = mf.explain(u, k)['backend']\n"
        "mf.fftconv(u, k)\n"
        "print(before, mf.explain(u, k)['backend'], mf.explain(u, k, precision='bf16')['backend'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True)
    assert out.stdout.split() == ["pending", "cuda-fp32", "cuda-tensor-core"]


@pytest.mark.parametrize("precision, length, keep", [("fp32", 2048, "0"), ("bf16", 2048, "0"), ("fp32", 20000, "0"),
                                                   ("fp32", 20000, "1")])
def test_compiled_training_step(precision, length, keep, monkeypatch, gen):
    """torch.compile(fullgraph=True) of a module holding FFTConv, forward and backward,
    matches eager (L = 20000: the four-step ops; with MONARCH_FFTCONV_KEEP_SPECTRUM=1, u's
    spectrum a saved activation of the compiled graph, read by the backward op)."""
    monkeypatch.setenv("MONARCH_FFTCONV_KEEP_SPECTRUM", keep)
    torch._dynamo.reset()  # the switch is read when the graph is traced: no graph of another setting
    model = torch.nn.Sequential(mf.FFTConv(4, length, precision=precision), torch.nn.GELU()).to(DEVICE)
    compiled = torch.compile(model, fullgraph=True)
    x = randn(gen, 2, 4, length, device=DEVICE)
    grads = []
    for run in (model, compiled):
        xg = x.clone().requires_grad_()
        run(xg).square().mean().backward()
        grads.append((xg.grad, model[0].filter.grad.clone()))
        model.zero_grad()
    for got, want in zip(*grads):
        assert rel_l2(got, want) <= 1e-5


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_graph_capture_and_replay(precision, gen):
    """fftconv and an FFTConv training step captured with torch.cuda.graph and replayed with
    new data in the captured buffers give the eager answers: no host sync, no allocation
    outside the caching allocator, no host-side cache lookup breaks capture."""
    u, k = randn(gen, 4, 8, 2048, device=DEVICE), randn(gen, 8, 2048, device=DEVICE)
    layer = mf.FFTConv(8, 2048, precision=precision).to(DEVICE)
    x = randn(gen, 4, 8, 2048, device=DEVICE, dtype=torch.float32).requires_grad_()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: loads the kernels, fills every host-side cache
        for _ in range(2):
            mf.fftconv(u, k, precision=precision)
            layer(x).square().mean().backward()
    torch.cuda.current_stream().wait_stream(side)
    layer.zero_grad(set_to_none=False)
    x.grad = None

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = mf.fftconv(u, k, precision=precision)
        layer(x).square().mean().backward()
    for _ in range(2):  # new data in the captured buffers
        u.copy_(randn(gen, 4, 8, 2048, device=DEVICE))
        k.copy_(randn(gen, 8, 2048, device=DEVICE))
        with torch.no_grad():
            x.copy_(randn(gen, 4, 8, 2048, device=DEVICE))
            layer.filter.copy_(randn(gen, 8, 2048, device=DEVICE))
        layer.filter.grad.zero_()
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(y, mf.fftconv(u, k, precision=precision), rtol=0, atol=0)
        expected = torch.autograd.grad(layer(x).square().mean(), layer.filter)[0]
        assert rel_l2(layer.filter.grad, expected) <= 1e-6


# ---------------------------------------------------------------- long sequences: four-step
# N = 65536 .. 2^23 (L = 16385 .. 4M): outer DFT, fused inner FFT conv, outer inverse, in fp32
# for every precision. The outer DFT runs in registers up to P = 32, in shared memory from 128.
FOURSTEP_LENGTHS = [16385, 32768, 40000, 131072]  # N = 65536, 65536, 131072, 262144 (P = 8 .. 32)
FOURSTEP_LONG = [200000, 1 << 19, 600000, 1 << 21, 3_000_001]  # N = 2^19 .. 2^23 (P = 128 .. 1024)


@pytest.mark.parametrize("precision, length", [(p, n) for p in BUDGETS for n in FOURSTEP_LENGTHS]
                         + [("fp32", n) for n in FOURSTEP_LONG] + [(p, 1 << 19) for p in BUDGETS if p != "fp32"])
def test_fourstep_every_size(length, precision, gen):
    batch, channels = (2, 3) if length < 150_000 else (1, 2)
    u, k = randn(gen, batch, channels, length, device=DEVICE), randn(gen, channels, length, device=DEVICE)
    y = poisoned_call(lambda: mf.fftconv(u, k, precision=precision), u)
    assert mf.explain(u, k, precision=precision)["backend"] == "cuda-four-step"
    assert torch.isfinite(y).all(), "unwritten (NaN) outputs"
    assert rel_l2(y, reference(u, k)) <= BUDGETS["fp32"]  # fp32 arithmetic whatever the precision


@pytest.mark.parametrize("length", [50000, 300000])
def test_fourstep_kernels_are_the_cpu_algorithm(length, gen):
    """The ops' CUDA kernels (filter spectrum, forward with and without the skip term, the
    backward's three gradients) against their CPU implementations (the same four steps in
    float64 torch.fft), given the same inputs; for a register (P = 16, N = 131072) and a
    shared-memory (P = 128, N = 2^20) outer stage."""
    u, k, D = randn(gen, 2, 3, length, device=DEVICE), randn(gen, 3, 777, device=DEVICE), randn(gen, 3, device=DEVICE)
    dy = randn(gen, 2, 3, length, device=DEVICE)
    spectrum = ops.filter_spectrum(k, length, "fp32")
    cpu = [t.cpu().double() for t in (u, k, D, dy)]
    want_spectrum = ops.filter_spectrum(cpu[1], length, "fp32")
    assert spectrum.shape == want_spectrum.shape
    assert rel_l2(spectrum.cpu(), want_spectrum) <= 1e-6
    spectrum_cpu = spectrum.cpu().double()
    for skip, skip_cpu in ((None, None), (D, cpu[2])):
        y = ops.conv_forward(u, spectrum, skip, "fp32")
        assert rel_l2(y.cpu(), ops.conv_forward(cpu[0], spectrum_cpu, skip_cpu, "fp32")) <= 1e-6
        ours = ops.fftconv_backward(dy, u, spectrum, skip, 777, "fp32")
        theirs = ops.fftconv_backward(cpu[3], cpu[0], spectrum_cpu, skip_cpu, 777, "fp32")
        for name, a, b in zip(("du", "dk", "dD"), ours, theirs):
            assert a.shape == b.shape and a.dtype == torch.float32, name
            assert a.numel() == 0 or rel_l2(a.cpu(), b) <= 1e-6, name  # dD is empty without a skip term


def test_fourstep_backward_is_deterministic(gen):
    u, k, D = randn(gen, 5, 3, 40000, device=DEVICE), randn(gen, 3, 40000, device=DEVICE), randn(gen, 3, device=DEVICE)
    dy = randn(gen, 5, 3, 40000, device=DEVICE)
    spectrum = ops.filter_spectrum(k, 40000, "fp32")
    first = ops.fftconv_backward(dy, u, spectrum, D, 40000, "fp32")
    for _ in range(2):
        again = ops.fftconv_backward(dy, u, spectrum, D, 40000, "fp32")
        assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_fourstep_split_is_the_bindings():
    from monarch_fftconv import fourstep, _extension

    coverage = _extension.coverage()
    assert coverage.fourstep == frozenset((1 << e, fourstep.inner_for(1 << e)) for e in range(16, 24))


@pytest.mark.parametrize("io_dtype", [torch.bfloat16, torch.float16])
def test_fourstep_half_io(io_dtype, gen):
    u, k = randn(gen, 2, 3, 30000, device=DEVICE, dtype=io_dtype), randn(gen, 3, 30000, device=DEVICE)
    y = poisoned_call(lambda: mf.fftconv(u, k, precision="bf16"), u)
    assert y.dtype == io_dtype and torch.isfinite(y).all()
    assert rel_l2(y, reference(u, k)) <= 2 * IO_ROUNDING[io_dtype]


def test_fourstep_odd_length_skip_and_strided_input(gen):
    """L = 100003 (N = 262144), Lk < L, the skip term, every other channel of a larger u."""
    base = randn(gen, 3, 4, 100003, device=DEVICE)
    u, k, D = base[:, ::2], randn(gen, 2, 1001, device=DEVICE), randn(gen, 2, device=DEVICE)
    y = poisoned_call(lambda: mf.fftconv(u, k, D=D), u)
    assert torch.isfinite(y).all()
    assert rel_l2(y, reference(u, k, D)) <= BUDGETS["fp32"]


def test_fourstep_sequences_stay_independent(gen):
    u, k = randn(gen, 3, 2, 20000, device=DEVICE), randn(gen, 2, 20000, device=DEVICE)
    y = mf.fftconv(u, k)
    u2 = u.clone()
    u2[1, 0] = float("nan")
    y2 = mf.fftconv(u2, k)
    mask = torch.ones(3, 2, dtype=torch.bool)
    mask[1, 0] = False
    assert torch.equal(y[mask], y2[mask]) and torch.isnan(y2[1, 0]).all()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("batch, channels, length, filter_len",
                         [(3, 2, 20000, 20000), (2, 3, 70001, 333), (2, 1, 700000, 700000)])
def test_fourstep_gradients(batch, channels, length, filter_len, precision, gen):
    check_gradients(batch, channels, length, filter_len, precision, 1.5 * BUDGETS["fp32"], gen)  # fp32 arithmetic


KEEP_SPECTRUM_ENV = "MONARCH_FFTCONV_KEEP_SPECTRUM"  # read by the binding at each training forward


@pytest.mark.watchdog(GPU_WATCHDOG_S)  # written in session 34 without a GPU: a hang fails, not stalls
@pytest.mark.parametrize("batch, channels, groups, length, filter_len, io_dtype", [
    (3, 2, 2, 20000, 20000, torch.float32),  # N = 65536 (P = 8)
    (2, 6, 3, 70001, 333, torch.bfloat16),  # N = 262144 (P = 32), grouped, 2-byte I/O, Lk < L
    (2, 3, 3, 300000, 7, torch.float32),  # N = 2^20 (P = 128: the shared-memory outer kernels)
    (2, 3, 3, 9000, 4001, torch.float32),  # N = 32768: below the four-step, nothing kept
])
def test_kept_spectrum_gives_the_same_bits(batch, channels, groups, length, filter_len, io_dtype, monkeypatch, gen):
    """MONARCH_FFTCONV_KEEP_SPECTRUM=1: the training step's forward keeps u's spectrum X (its inner
    kernel stores it) and the backward reads it instead of recomputing it (one outer forward
    launch, not two). y, du, dk and dD are the bits of the step without it, within the fp32 budget
    of float64; a second backward (retain_graph) reads X again and gives the same bits; X itself
    is u's four-step spectrum (against float64), empty below N = 65536; the backward op refuses
    an X of another shape."""
    u = randn(gen, batch, channels, length, device=DEVICE).to(io_dtype)
    k = randn(gen, groups, filter_len, device=DEVICE) / filter_len**0.5
    D = randn(gen, channels, device=DEVICE)
    dy = randn(gen, batch, channels, length, device=DEVICE).to(io_dtype)

    def step():
        leaves = [u.clone().requires_grad_(), k.clone().requires_grad_(), D.clone().requires_grad_()]
        y = mf.fftconv(leaves[0], leaves[1], D=leaves[2])
        first = torch.autograd.grad(y, leaves, dy, retain_graph=True)
        second = torch.autograd.grad(y, leaves, dy, retain_graph=True)
        launched = kernels_launched(lambda: torch.autograd.grad(y, leaves, dy))
        launches = sum("outer_forward" in name for name in launched)  # the four-step outer forwards
        return y.detach(), first, second, launches

    monkeypatch.delenv(KEEP_SPECTRUM_ENV, raising=False)
    y, recomputed, _, recomputed_launches = step()
    monkeypatch.setenv(KEEP_SPECTRUM_ENV, "1")
    y_kept, kept, kept_again, kept_launches = step()
    fourstep_size = plan_for(length).fft_size >= fourstep.MIN_FFT_SIZE
    assert (recomputed_launches, kept_launches) == ((2, 1) if fourstep_size else (0, 0))
    assert torch.equal(y_kept, y)
    for name, a, b, c in zip(("du", "dk", "dD"), kept, recomputed, kept_again):
        assert torch.equal(a, b) and torch.equal(a, c), name

    u64 = u.double().requires_grad_()
    k64, D64 = k.double().requires_grad_(), D.double().requires_grad_()
    want = torch.autograd.grad(reference(u64, k64.repeat_interleave(channels // groups, dim=0), D64),
                               (u64, k64, D64), dy.double())
    budget = 1.5 * BUDGETS["fp32"]
    assert rel_l2(kept[0], want[0]) <= budget + 2 * IO_ROUNDING[io_dtype]
    assert rel_l2(kept[1], want[1]) <= budget
    # dD: an fp32 sum of B·L products of either sign, bound by the terms' absolute sum (as CPU's four-step test)
    terms = (u.double() * dy.double()).abs().sum((0, 2))
    assert ((kept[2].double() - want[2]).abs() <= 1e-6 * terms).all()

    y_op, spectrum, u_spectrum = ops.fftconv_keeping_spectrum_op(u, k, D, "fp32")
    assert torch.equal(y_op, y)
    if not fourstep_size:
        assert u_spectrum.numel() == 0
        return
    n = plan_for(length).fft_size
    want_x = torch.view_as_real(fourstep.spectrum_reference(u.double(), n, fourstep.inner_for(n)))
    assert u_spectrum.shape == want_x.shape and u_spectrum.dtype == torch.float32
    assert rel_l2(u_spectrum, want_x) <= BUDGETS["fp32"]
    with pytest.raises(ValueError, match="u_spectrum must be contiguous float32"):
        ops.fftconv_backward_from_spectrum_op(dy, u, u_spectrum[:, :1], spectrum, D, filter_len, "fp32")


SUM_IN_GRAD_ENV = "MONARCH_FFTCONV_FOURSTEP_SUM_IN_GRAD"  # read by the binding at each four-step backward


@pytest.mark.watchdog(GPU_WATCHDOG_S)  # written in session 34 without a GPU: a hang fails, not stalls
@pytest.mark.parametrize("batch, channels, groups, length, filter_len, io_dtype, keep", [
    (3, 96, 96, 40000, 40000, torch.float32, False),  # N = 131072: 864 (c, k2) items, G over X's rows
    (2, 48, 24, 70001, 333, torch.bfloat16, True),  # N = 262144: 816 items; grouped, 2-byte I/O, X kept
    (3, 33, 33, 150000, 999, torch.float32, False),  # N = 2^19: M = 4096 (two slots a CTA), 2145 items:
                                                     # the last CTA's second slot idle through the B steps
    (1, 3, 3, 20000, 777, torch.float32, True),  # one batch: summed whatever the rows
    (4, 8, 8, 20000, 20000, torch.float32, True),  # 40 items: under two waves, batch_sum runs
])
def test_grad_kernel_sums_the_batch(batch, channels, groups, length, filter_len, io_dtype, keep, monkeypatch, gen):
    """MONARCH_FFTCONV_FOURSTEP_SUM_IN_GRAD unset or "1" (the default since session 35): kGradSum
    sums the filter gradient over the batch, a
    slot taking a (c, k2)'s B rows in order, where the call has one batch or (c, k2) rows for two
    waves of slots (here: B = 1, or more items than twice 3 CTAs of every SM, an upper bound of
    the residency); elsewhere batch_sum runs as before (profiler: which ran). du, dk and dD are the
    bits of the backward with "0" (batch_sum's order: b = 0 .. B-1, then the 1/N), with u's
    spectrum recomputed or kept (then a second backward of the same graph the same bits: X left
    as it was); dk within the fp32 budget of float64. An unknown value of either switch is refused."""
    u = randn(gen, batch, channels, length, device=DEVICE).to(io_dtype)
    k = randn(gen, groups, filter_len, device=DEVICE) / filter_len**0.5
    D = randn(gen, channels, device=DEVICE)
    dy = randn(gen, batch, channels, length, device=DEVICE).to(io_dtype)
    leaves = [u.clone().requires_grad_(), k.clone().requires_grad_(), D.clone().requires_grad_()]

    def grads():
        return torch.autograd.grad(mf.fftconv(leaves[0], leaves[1], D=leaves[2]), leaves, dy)

    monkeypatch.setenv(KEEP_SPECTRUM_ENV, "1" if keep else "0")
    monkeypatch.setenv(SUM_IN_GRAD_ENV, "0")
    by_batch_sum = grads()
    assert not any("InnerMode)5>" in name for name in kernels_launched(grads))
    monkeypatch.delenv(SUM_IN_GRAD_ENV, raising=False)  # the default
    summed = grads()
    launched = kernels_launched(grads)
    monkeypatch.setenv(SUM_IN_GRAD_ENV, "1")
    assert all(torch.equal(a, b) for a, b in zip(grads(), summed))
    n = plan_for(length).fft_size
    items, slots_per_cta = channels * fourstep.spectrum_rows(n), 2 if fourstep.inner_for(n) == 4096 else 1
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
    summing = any("InnerMode)5>" in name for name in launched)  # kGradSum's instance
    assert summing != any("batch_sum_kernel" in name for name in launched), sorted(launched)
    if batch == 1 or items >= 2 * 3 * sms * slots_per_cta:
        assert summing, sorted(launched)
    elif items < sms:
        assert not summing, sorted(launched)
    for name, a, b in zip(("du", "dk", "dD"), summed, by_batch_sum):
        assert torch.equal(a, b), name
    if keep:
        y = mf.fftconv(leaves[0], leaves[1], D=leaves[2])
        first = torch.autograd.grad(y, leaves, dy, retain_graph=True)
        for name, a, b in zip(("du", "dk", "dD"), torch.autograd.grad(y, leaves, dy), first):
            assert torch.equal(a, b), name
    k64 = k.double().requires_grad_()
    want_dk, = torch.autograd.grad(reference(u.double(), k64.repeat_interleave(channels // groups, dim=0), D.double()),
                                   k64, dy.double())
    assert rel_l2(summed[1], want_dk) <= 1.5 * BUDGETS["fp32"]
    for env in (SUM_IN_GRAD_ENV, KEEP_SPECTRUM_ENV):
        monkeypatch.setenv(env, "on")
        with pytest.raises(ValueError, match=f"{env} must be '[01]' or '[01]'"):
            grads()
        monkeypatch.setenv(env, "0")


@pytest.mark.watchdog(GPU_WATCHDOG_S)  # written in session 29 without a GPU: a hang fails, not stalls
@pytest.mark.parametrize("length", [8192, 1500])
def test_the_mma_kernels_fp16_range_is_the_portable_engines(length, monkeypatch):
    """README, "Precision": the mma.sync kernel rounds where the portable engine does, so its
    fp16 ceiling is the same column sum (65504 over ceil(L/M) live rows) and its floor the same
    subnormal spacing: a constant u just under the ceiling exact, just over it not finite; an
    output of a tenth of the floor's rms with the model's error, 2^-24·sqrt(N/6)/rms(y)."""
    monkeypatch.setenv(BACKEND_ENV, "portable")  # on CUDA tensors: the kernels, whatever the size
    monkeypatch.setenv("MONARCH_FFTCONV_TC_KERNEL", "mma")
    ceiling = fp16_constant_ceiling(length)
    k = torch.ones(1, 1, device=DEVICE)
    below = torch.full((2, 1, length), 0.97 * ceiling, device=DEVICE)
    y = mf.fftconv(below, k, precision="fp16")
    assert torch.isfinite(y).all() and rel_l2(y, reference(below, k)) <= BUDGETS["fp16"]
    assert not torch.isfinite(mf.fftconv(torch.full((2, 1, length), 1.03 * ceiling, device=DEVICE), k,
                                         precision="fp16")).all()
    gen = torch.Generator().manual_seed(length)
    u = torch.randn(2, 3, length, generator=gen)
    decaying = torch.randn(3, length, generator=gen) * torch.exp(-torch.arange(length) / 500.0)
    unit = reference(u, decaying)
    floor_rms = fp16_subnormal_error(plan_for(length).fft_size) / 1.5e-3
    small, decaying = (u * (0.1 * floor_rms / unit.pow(2).mean().sqrt().item())).to(DEVICE), decaying.to(DEVICE)
    error = rel_l2(mf.fftconv(small, decaying, precision="fp16"), reference(small, decaying))
    assert 0.75 * 1.5e-2 < error < 1.33 * 1.5e-2
