"""The Hopper tensor-core engine's forward (docs/design.md, "The next tensor-core engine"), run on
request (MONARCH_FFTCONV_TC_KERNEL=engine) at N = 16384, bf16 and fp16 operands, fp32 I/O (and
2-byte I/O, below): the float64 budget with an odd batch (the last pair's partner is zeros) and
L not a multiple of 128, the skip term folded into the spectrum, the NaN rule (a poisoned
sequence does not reach its pair partner; the other pairs are bitwise unchanged), determinism,
and that the request reaches the engine; and the route (backends.ENGINE_ROUTE) that sends large
calls to it. Skipped without a GPU. Each test runs in a child process under the watchdog
(conftest.py): the engine's first run hung, and a hang must fail, not stall the suite."""

import pytest
import torch

import monarch_fftconv as mf
from monarch_fftconv.backends import BACKEND_ENV

from helpers import BUDGETS, GPU_WATCHDOG_S, randn, reference, rel_l2, requires_cuda
from test_cuda import kernels_launched, poisoned_call

pytestmark = [requires_cuda, pytest.mark.watchdog(GPU_WATCHDOG_S)]

DEVICE = "cuda"
KERNEL_ENV = "MONARCH_FFTCONV_TC_KERNEL"
PRECISIONS = ["bf16", "fp16"]


@pytest.fixture
def engine(monkeypatch):
    """The engine, through the ops (MONARCH_FFTCONV_BACKEND=portable): calls that fill the GPU
    would otherwise take the fp32 kernel."""
    monkeypatch.setenv(KERNEL_ENV, "engine")
    monkeypatch.setenv(BACKEND_ENV, "portable")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("length", [8192, 8191])
def test_budget_odd_batch(length, precision, engine, gen):
    u, k = randn(gen, 3, 5, length, device=DEVICE), randn(gen, 5, length, device=DEVICE)
    d = randn(gen, 5, device=DEVICE)
    y = poisoned_call(lambda: mf.fftconv(u, k, D=d, precision=precision), u)
    assert torch.isfinite(y).all(), "unwritten (NaN) outputs"
    assert rel_l2(y, reference(u, k, d)) <= BUDGETS[precision]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_budget_small_filter(precision, engine, gen):
    """The benchmark's filter scale (randn/sqrt(L)): the per-channel 2^e keeps fp16's spectrum normal."""
    length = 8192
    u, k = randn(gen, 3, 5, length, device=DEVICE), randn(gen, 5, length, device=DEVICE) / length**0.5
    assert rel_l2(mf.fftconv(u, k, precision=precision), reference(u, k)) <= BUDGETS[precision]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_request_reaches_the_engine(precision, monkeypatch, gen):
    u, k = randn(gen, 4, 6, 8192, device=DEVICE), randn(gen, 6, 8192, device=DEVICE)
    monkeypatch.setenv(BACKEND_ENV, "portable")
    monkeypatch.setenv(KERNEL_ENV, "mma")
    old = mf.fftconv(u, k, precision=precision)
    monkeypatch.setenv(KERNEL_ENV, "engine")
    new = mf.fftconv(u, k, precision=precision)
    assert not torch.equal(old, new), "the request did not reach the engine"
    assert rel_l2(new, old) <= BUDGETS[precision]


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_a_nonfinite_sequence_stays_alone(poison, precision, engine, gen):
    """Batch entries (0, 1), (2, 3), (4) pair up; a NaN/Inf in entry 1 of channel 2 is rerun
    unpacked: entry 0 stays finite and within the budget, every other pair is bitwise unchanged."""
    length = 8191
    u, k = randn(gen, 5, 3, length, device=DEVICE), randn(gen, 3, length, device=DEVICE)
    clean = mf.fftconv(u, k, precision=precision)
    u[1, 2, 1234] = poison
    dirty = mf.fftconv(u, k, precision=precision)
    assert not torch.isfinite(dirty[1, 2]).all()
    assert torch.isfinite(dirty[0, 2]).all(), "the poison reached the pair partner"
    assert rel_l2(dirty[0, 2], reference(u[0, 2], k[2])) <= BUDGETS[precision]
    mask = torch.ones(5, 3, dtype=torch.bool)
    mask[0, 2] = mask[1, 2] = False
    assert torch.equal(dirty[mask], clean[mask])


@pytest.mark.parametrize("precision", PRECISIONS)
def test_deterministic(precision, engine, gen):
    u, k = randn(gen, 3, 5, 8192, device=DEVICE), randn(gen, 5, 8192, device=DEVICE)
    first = mf.fftconv(u, k, precision=precision)
    for _ in range(3):
        assert torch.equal(mf.fftconv(u, k, precision=precision), first)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_many_jobs_per_cta(precision, engine, gen):
    """More jobs than SMs: each CTA walks a channel-major range and changes channel (filter reloads)."""
    u, k = randn(gen, 8, 96, 8192, device=DEVICE), randn(gen, 96, 8192, device=DEVICE)
    y = poisoned_call(lambda: mf.fftconv(u, k, precision=precision), u)
    assert torch.isfinite(y).all(), "unwritten (NaN) outputs"
    assert rel_l2(y, reference(u, k)) <= BUDGETS[precision]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_zero_and_tiny_channels(precision, engine, gen):
    """The filter's 2^e at the ends of its range (its data flow: test_tc_engine_dataflow.py):
    channel 0's filter is all zeros (exact zeros without D, D·u with it), channel 1's is scaled
    by 1e-40 (2^e = 2^141 overflows fp32: the channel was all NaN), channel 2's is ordinary.
    Each channel within the budget on its own."""
    length = 8192
    u, k = randn(gen, 3, 3, length, device=DEVICE), randn(gen, 3, length, device=DEVICE)
    k[0] = 0.0
    k[1] *= 1e-40
    plain = mf.fftconv(u, k, precision=precision)
    assert torch.equal(plain[:, 0], torch.zeros_like(plain[:, 0]))
    d = randn(gen, 3, device=DEVICE)
    d[1] = 0.0  # the tiny filter alone: a skip term would set the channel's scale
    for y, ref in ((plain, reference(u, k)), (mf.fftconv(u, k, D=d, precision=precision), reference(u, k, d))):
        assert torch.isfinite(y).all()
        for c in range(3):
            if not ref[:, c].any():  # the zero filter without D: exact zeros (a relative error is 0/0)
                assert not y[:, c].any(), f"channel {c}"
            else:
                assert rel_l2(y[:, c], ref[:, c]) <= BUDGETS[precision], f"channel {c}"


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("length", [8192, 8188, 4097])
def test_the_route_runs_the_engine_within_the_budget(length, precision, monkeypatch, gen):
    """ENGINE_ROUTE on (written in session 20 without a GPU): a public call of exactly
    ENGINE_MIN_SEQUENCES sequences at N = 16384 with fp32 I/O takes the tensor cores, explain()
    names the engine, the output is bitwise the requested engine's (MONARCH_FFTCONV_TC_KERNEL=engine
    through the ops) and within the budget against float64. L = 8188 takes the vector loads with
    a partial last row, 4097 the smallest L at this N."""
    from monarch_fftconv import backends
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    monkeypatch.setattr(backends, "ENGINE_ROUTE", True)
    monkeypatch.setattr(backends, "_decisions", {})
    batch, channels = 16, backends.ENGINE_MIN_SEQUENCES // 16
    u = randn(gen, batch, channels, length, device=DEVICE)
    k = randn(gen, channels, length, device=DEVICE) / length**0.5
    d = randn(gen, channels, device=DEVICE)
    routed = poisoned_call(lambda: mf.fftconv(u, k, D=d, precision=precision), u)
    info = mf.explain(u, k, D=d, precision=precision)
    assert info["backend"] == "cuda-tensor-core" and "the tensor-core engine" in info["kernel"], info
    assert torch.isfinite(routed).all(), "unwritten (NaN) outputs"
    assert rel_l2(routed, reference(u, k, d)) <= BUDGETS[precision]
    monkeypatch.setenv(KERNEL_ENV, "engine")
    monkeypatch.setenv(BACKEND_ENV, "portable")
    assert torch.equal(routed, mf.fftconv(u, k, D=d, precision=precision))


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("io_dtype", [torch.bfloat16, torch.float16])
def test_the_route_runs_the_engine_on_two_byte_io(io_dtype, precision, monkeypatch, gen):
    """Session 36 put 2-byte I/O on the route: a public call of ENGINE_MIN_SEQUENCES sequences
    at N = 16384 with bf16/fp16 u takes the engine's 2-byte instance (explain() and the launch
    say so), y in u's dtype within the budget plus y's rounding, and the fp32-I/O engine's bits
    on the same values, rounded (the same operands and arithmetic)."""
    from monarch_fftconv import backends
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    monkeypatch.setattr(backends, "_decisions", {})
    batch, channels, length = 16, backends.ENGINE_MIN_SEQUENCES // 16, 8191
    u = randn(gen, batch, channels, length, device=DEVICE).to(io_dtype)
    k = randn(gen, channels, length, device=DEVICE) / length**0.5
    d = randn(gen, channels, device=DEVICE)
    y = poisoned_call(lambda: mf.fftconv(u, k, D=d, precision=precision), u)  # first: it loads the extension
    info = mf.explain(u, k, D=d, precision=precision)
    assert info["backend"] == "cuda-tensor-core" and "the tensor-core engine" in info["kernel"], info
    assert y.dtype == io_dtype and torch.isfinite(y).all(), "unwritten (NaN) outputs"
    assert rel_l2(y, reference(u, k, d)) <= BUDGETS[precision] + IO_ROUNDING[io_dtype]
    assert torch.equal(mf.fftconv(u.float(), k, D=d, precision=precision).to(io_dtype), y)
    io_type = {torch.bfloat16: "IOType)1", torch.float16: "IOType)2"}[io_dtype]
    launched = kernels_launched(lambda: mf.fftconv(u, k, D=d, precision=precision))
    assert any("engine_forward_kernel" in name and io_type in name for name in launched), launched


@pytest.mark.parametrize("mean", [8.0, 64.0])
def test_fp16_calls_of_the_route_size_stay_finite_on_inputs_with_a_mean(mean, monkeypatch, gen):
    """A public fp16 call of the route's size, u of mean 8 or 64 (a DC bin of 65536 or 524288 at
    L = 8192) through a low-pass filter, exp(-t/500): it takes the engine (fp16 back on the route
    since session 30), finite and within budget, bitwise the requested engine's. With the filter's
    peak near 2^-7 (engine_traits.cuh's default peak exponent 7) the engine's model keeps both
    within budget, where the old default 0 overflowed from a mean of 4
    (test_tc_engine_dataflow.py): a build with MONARCH_FFTCONV_ENGINE_FILTER_PEAK_EXPONENT=0
    fails here. Written in session 29, changed in session 30 without a GPU, then passed on an
    H100 in session 30."""
    from monarch_fftconv import backends
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    monkeypatch.setattr(backends, "_decisions", {})
    batch, channels, length = 16, backends.ENGINE_MIN_SEQUENCES // 16, 8192
    u = randn(gen, batch, channels, length, device=DEVICE) + mean
    k = torch.exp(-torch.arange(length, device=DEVICE) / 500.0).expand(channels, length).contiguous()
    # the call first: it loads the extension, which explain() never does
    y = poisoned_call(lambda: mf.fftconv(u, k, precision="fp16"), u)
    info = mf.explain(u, k, precision="fp16")
    assert info["backend"] == "cuda-tensor-core" and "the tensor-core engine" in info["kernel"], info
    assert torch.isfinite(y).all()
    assert rel_l2(y, reference(u, k)) <= BUDGETS["fp16"]
    monkeypatch.setenv(KERNEL_ENV, "engine")
    monkeypatch.setenv(BACKEND_ENV, "portable")
    assert torch.equal(y, mf.fftconv(u, k, precision="fp16"))


# The engine's fixed-cost switches (binding.cpp, engine_switches_from_env): each one's other
# value must give the default's bits. Each value: (default, other).
ENGINE_SWITCHES = {
    "MONARCH_FFTCONV_ENGINE_TABLES": ("angles", "elements"),
    "MONARCH_FFTCONV_ENGINE_EARLY_FILTER_RELEASE": ("0", "1"),
    "MONARCH_FFTCONV_ENGINE_PDL": ("0", "1"),
}


def _bits(y):
    return y.view(torch.int32)  # NaN outputs compared by their bits too


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", list(ENGINE_SWITCHES))
def test_fixed_cost_switches_give_the_same_bits(name, precision, engine, monkeypatch, gen):
    """8 x 200 x 8192: 800 jobs, ~6 a CTA, channel changes inside CTAs (filter reloads, early
    releases); then poison in sequence 7 (the last job of its channel: a rerun after an early
    release reloads the filter) and 1 (a first job) of every third channel, L = 8191."""
    u, k = randn(gen, 8, 200, 8192, device=DEVICE), randn(gen, 200, 8192, device=DEVICE)
    d = randn(gen, 200, device=DEVICE)
    poisoned = randn(gen, 8, 200, 8191, device=DEVICE)
    poisoned[7, ::3, 100] = float("nan")
    poisoned[1, 1::3, 4000] = float("inf")
    k2 = k[:, :8191].contiguous()
    default, other = ENGINE_SWITCHES[name]
    results = {}
    for value in (default, other):
        monkeypatch.setenv(name, value)
        results[value] = (mf.fftconv(u, k, D=d, precision=precision), mf.fftconv(poisoned, k2, precision=precision))
        torch.cuda.synchronize()
    for a, b in zip(results[default], results[other]):
        assert torch.equal(_bits(a), _bits(b)), f"{name}={other} changed the output's bits"
    clean = results[default][0]
    assert torch.isfinite(clean).all() and rel_l2(clean, reference(u, k, d)) <= BUDGETS[precision]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_all_fixed_cost_switches_together(precision, engine, monkeypatch, gen):
    """Every switch at its other value at once, many jobs a CTA: the default's bits."""
    u, k = randn(gen, 16, 264, 8192, device=DEVICE), randn(gen, 264, 8192, device=DEVICE) / 8192**0.5
    first = mf.fftconv(u, k, precision=precision)
    for name, (_, other) in ENGINE_SWITCHES.items():
        monkeypatch.setenv(name, other)
    for _ in range(3):
        assert torch.equal(mf.fftconv(u, k, precision=precision), first)


def test_an_unknown_engine_switch_value_is_refused(engine, monkeypatch, gen):
    u, k = randn(gen, 2, 3, 8192, device=DEVICE), randn(gen, 3, 8192, device=DEVICE)
    monkeypatch.setenv("MONARCH_FFTCONV_ENGINE_EARLY_FILTER_RELEASE", "yes")
    with pytest.raises(ValueError, match="MONARCH_FFTCONV_ENGINE_EARLY_FILTER_RELEASE"):
        mf.fftconv(u, k, precision="bf16")


# The engine takes 2-byte u and y (session 35's build switch, measured and made the code in session 36).
IO_ROUNDING = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


@pytest.mark.parametrize("io_dtype", list(IO_ROUNDING))
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("batch, length, channel_step", [(3, 8192, 1), (5, 8191, 1), (4, 4097, 2), (2, 8192, 3),
                                                         (3, 4100, 2)])  # 16-byte rows, a partial last chunk
def test_two_byte_io_reaches_the_engine_within_the_budget(batch, length, channel_step, precision, io_dtype,
                                                           engine, gen):
    """2-byte u and y through the engine: an odd batch, L not a multiple of 8 (the scalar loads),
    a channel-strided u (16-byte vectors only where the strides allow), the skip term; y in u's
    dtype, every output written, within the precision's budget plus y's rounding; the bits of
    the fp32-I/O engine on the same values, rounded to u's dtype (the operands and the
    arithmetic are the same); the same bits twice; and the engine's 2-byte instance is what ran."""
    channels = 5
    base = randn(gen, batch, channels * channel_step, length, device=DEVICE).to(io_dtype)
    u = base[:, ::channel_step]
    k, d = randn(gen, channels, length, device=DEVICE), randn(gen, channels, device=DEVICE)
    y = poisoned_call(lambda: mf.fftconv(u, k, D=d, precision=precision), u)
    assert y.dtype == io_dtype and torch.isfinite(y).all(), "unwritten (NaN) outputs"
    assert rel_l2(y, reference(u, k, d)) <= BUDGETS[precision] + IO_ROUNDING[io_dtype]
    assert torch.equal(mf.fftconv(u.float(), k, D=d, precision=precision).to(io_dtype), y)
    assert torch.equal(mf.fftconv(u, k, D=d, precision=precision), y)
    io_type = {torch.bfloat16: "IOType)1", torch.float16: "IOType)2"}[io_dtype]
    launched = kernels_launched(lambda: mf.fftconv(u, k, D=d, precision=precision))
    assert any("engine_forward_kernel" in name and io_type in name for name in launched), launched
