"""The portable engine against float64 torch.fft: shapes, precisions, structure. Every
call here runs the engine (MONARCH_FFTCONV_BACKEND=portable): by default CPU calls take
torch.fft."""

import pytest
import torch

import monarch_fftconv as mf
from monarch_fftconv import portable
from monarch_fftconv.planner import plan_for

from helpers import BUDGETS, fp16_constant_ceiling, fp16_subnormal_error, randn, reference, rel_l2, run_python

@pytest.fixture(autouse=True)
def _engine(portable_engine):
    assert mf.explain(torch.ones(1, 1, 8), torch.ones(1, 8))["backend"] == "portable"


SHAPES = [  # (B, C, L, Lk): seed scale, odd batch, non-power-of-two L, short filters
    (2, 4, 8192, 8192), (3, 5, 1000, 1000), (1, 3, 1, 1), (5, 2, 3, 2),
    (3, 2, 100, 100), (1, 3, 5000, 5000), (2, 2, 5000, 17), (1, 2, 9000, 9000),
]


@pytest.mark.parametrize("precision", list(BUDGETS))
@pytest.mark.parametrize("batch, channels, length, filter_len", SHAPES)
def test_error_budget(batch, channels, length, filter_len, precision, gen):
    u, k = randn(gen, batch, channels, length), randn(gen, channels, filter_len)
    y = mf.fftconv(u, k, precision=precision)
    assert y.shape == u.shape and y.dtype == u.dtype
    assert rel_l2(y, reference(u, k)) <= BUDGETS[precision]


def test_fp32_allclose_at_seed_scale(gen):
    u, k = randn(gen, 2, 4, 8192), randn(gen, 4, 8192)
    ref = reference(u, k)
    assert ref.std() > 30  # outputs of this size are what makes allclose demanding
    assert torch.allclose(mf.fftconv(u, k).double(), ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("precision", ["bf16", "tf32"])
def test_low_precision_does_not_pass_allclose(precision, gen):
    """The reason the fp32 path exists: emulated tensor-core precisions miss this tolerance."""
    u, k = randn(gen, 2, 4, 8192), randn(gen, 4, 8192)
    assert not torch.allclose(mf.fftconv(u, k, precision=precision).double(), reference(u, k), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype, budget", [(torch.bfloat16, 1e-2), (torch.float16, 2e-3)])
def test_half_inputs_keep_their_dtype_and_budget(dtype, budget, gen):
    u, k = randn(gen, 3, 2, 2000, dtype=dtype), randn(gen, 2, 2000)
    y = mf.fftconv(u, k)
    assert y.dtype == dtype
    assert rel_l2(y, reference(u, k)) <= budget + 4e-3  # + rounding y itself to the io dtype


def test_fp16_does_not_overflow_at_seed_scale(gen):
    """fp16 cuFFT returns NaN here; the 1/N folded into the filter keeps fp16 in range."""
    u, k = randn(gen, 2, 4, 8192, dtype=torch.float16), randn(gen, 4, 8192)
    y = mf.fftconv(u, k, precision="fp16")
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("length", [8192, 1500])
def test_fp16_range_floor_is_where_the_readme_puts_it(length, gen):
    """The other side of folding 1/N into the filter (README, "Precision"): the spectrum's
    products of a small output fall among fp16's subnormals (spacing 2^-24), which leaves
    about 2^-24·sqrt(N/6)/rms(y) of relative error. Above the stated floor fp16 keeps its
    budget; ten and a hundred times below it the error grows as that model says; bf16, with
    fp32's exponent, keeps its budget at every scale."""
    u, k = randn(gen, 2, 3, length), randn(gen, 3, length)
    k = k * torch.exp(-torch.arange(length) / 500.0)  # a decaying filter, as Hyena's are
    n = plan_for(length).fft_size
    unit = reference(u, k)
    floor = fp16_subnormal_error(n) / 1.5e-3  # the output rms at which the floor takes 1.5e-3
    errors = {}
    for times_floor in (1.0, 0.1, 0.01):
        scale = times_floor * floor / unit.pow(2).mean().sqrt().item()
        small_u = u * scale
        errors[times_floor] = rel_l2(mf.fftconv(small_u, k, precision="fp16"), unit * scale)
        assert rel_l2(mf.fftconv(small_u, k, precision="bf16"), unit * scale) <= BUDGETS["bf16"]
    assert errors[1.0] <= BUDGETS["fp16"]
    for times_floor in (0.1, 0.01):  # the model's subnormal term, within a third
        predicted = 1.5e-3 / times_floor
        assert 0.75 * predicted < errors[times_floor] < 1.33 * predicted


@pytest.mark.parametrize("length", [8192, 1500])
def test_fp16_ceiling_is_where_the_readme_puts_it(length):
    """fp16's ceiling (README, "Precision"): stage 1 sums the ceil(L/M) live rows of each
    column, so a constant u overflows its fp16 operand once c·ceil(L/M) passes 65504: below,
    the call is finite and within budget; above, the README says it is not, and so it is."""
    ceiling = fp16_constant_ceiling(length)
    k = torch.ones(1, 1)
    below = torch.full((1, 1, length), 0.97 * ceiling)
    y = mf.fftconv(below, k, precision="fp16")
    assert torch.isfinite(y).all() and rel_l2(y, reference(below, k)) <= BUDGETS["fp16"]
    assert not torch.isfinite(mf.fftconv(torch.full((1, 1, length), 1.03 * ceiling), k, precision="fp16")).all()
    assert torch.isfinite(mf.fftconv(torch.full((1, 1, length), 1.03 * ceiling), k, precision="bf16")).all()


def test_fp16_ceiling_comes_lower_through_a_filter_that_sums_to_500():
    """The README's low-pass example: exp(-t/500) sums to ~500, and the filtered spectrum's DC
    bin carries that gain into inverse stage 2: a constant 256 is exact, 512 is not finite."""
    length = 8192
    k = torch.exp(-torch.arange(length, dtype=torch.float32) / 500.0).unsqueeze(0)
    exact = torch.full((1, 1, length), 256.0)
    assert rel_l2(mf.fftconv(exact, k, precision="fp16"), reference(exact, k)) <= BUDGETS["fp16"]
    assert not torch.isfinite(mf.fftconv(torch.full((1, 1, length), 512.0), k, precision="fp16")).all()


def test_non_contiguous_inputs(gen):
    base = randn(gen, 6, 3, 1200)
    u = base[::2, :, 100:1100]  # strided batch, offset time
    k = randn(gen, 1000, 3).t()  # transposed filter
    assert not u.is_contiguous() and not k.is_contiguous()
    assert rel_l2(mf.fftconv(u, k), reference(u, k)) <= BUDGETS["fp32"]


def test_skip_term(gen):
    u, k, D = randn(gen, 3, 4, 500), randn(gen, 4, 300), randn(gen, 4)
    assert rel_l2(mf.fftconv(u, k, D=D), reference(u, k, D)) <= BUDGETS["fp32"]


def test_batch_elements_stay_independent(gen):
    u, k = randn(gen, 4, 3, 1024), randn(gen, 3, 1024)
    clean = mf.fftconv(u, k, precision="bf16")
    u[1, 2, 17] = float("nan")
    u[2, 0, 5] = float("inf")
    poisoned = mf.fftconv(u, k, precision="bf16")
    keep = torch.ones(4, dtype=torch.bool)
    keep[1] = keep[2] = False
    assert torch.equal(poisoned[keep], clean[keep])


def test_output_is_causal(gen):
    """Changing u at time t0 leaves every output before t0 unchanged."""
    u, k = randn(gen, 1, 2, 777), randn(gen, 2, 777)
    y0 = mf.fftconv(u, k)
    u2 = u.clone()
    u2[..., 400:] += 1.0
    y1 = mf.fftconv(u2, k)
    assert torch.allclose(y0[..., :400], y1[..., :400], atol=1e-4)
    assert not torch.allclose(y0[..., 400:], y1[..., 400:], atol=1e-2)


def test_inverse_produces_only_requested_outputs(gen):
    plan = plan_for(1000)
    x = randn(gen, 2, 1000)
    spectrum = portable.forward_spectrum(x, plan, "fp32") / plan.fft_size
    full = portable.inverse_spectrum(spectrum, plan, "fp32", 1000)
    part = portable.inverse_spectrum(spectrum, plan, "fp32", 300)
    assert part.shape == (2, 300)
    torch.testing.assert_close(part, full[..., :300])
    torch.testing.assert_close(full, x, atol=1e-5, rtol=1e-5)  # round trip


@pytest.mark.parametrize("precision", ["tf32", "bf16", "fp16"])
def test_rounding_emulation_lands_on_the_grid(precision, gen):
    x = randn(gen, 1000)
    r = portable.round_operand(x, precision)
    if precision == "tf32":
        assert (r.view(torch.int32) & 0x1FFF == 0).all()
        assert ((r - x).abs() <= x.abs() * 2.0**-11).all()
    else:
        low = torch.bfloat16 if precision == "bf16" else torch.float16
        torch.testing.assert_close(r, x.to(low).float(), rtol=0, atol=0)


def test_tables_first_built_under_inference_mode_serve_autograd():
    """The cached tables (the radix plan's and the four-step twiddles) are normal tensors even
    when a call under torch.inference_mode() builds them first: a later recorded call saves
    them for backward (it raised "Inference tensors cannot be saved for backward"). In a child
    process, so that the caches start empty; the gradients are checked against torch.fft."""
    code = """
import torch
from monarch_fftconv import fourstep, portable
from monarch_fftconv.planner import plan_for
plan = plan_for(96)
k = torch.randn(3, 96, dtype=torch.float64)
with torch.inference_mode():
    portable.filter_spectrum(k, plan, "fp32")
    fourstep.spectrum_reference(torch.randn(1, 3, 96, dtype=torch.float64), 256, 16)
u = torch.randn(2, 3, 96, dtype=torch.float64, requires_grad=True)
y = portable.conv_forward(u, portable.filter_spectrum(k, plan, "fp32"), None, plan, "fp32")
x = torch.randn(1, 3, 96, dtype=torch.float64, requires_grad=True)
s = torch.view_as_real(fourstep.spectrum_reference(x, 256, 16))
g = torch.randn_like(y)
(gu,) = torch.autograd.grad(y, u, g)
n = 2 * 96
want = torch.fft.irfft(torch.fft.rfft(g.flip(-1), n=n) * torch.fft.rfft(k, n=n), n=n)[..., :96].flip(-1)
assert (gu - want).norm() < 1e-10 * want.norm(), (gu - want).norm()
(gx,) = torch.autograd.grad(s.sum(), x)
assert torch.isfinite(gx).all()
print("ok")
"""
    run = run_python(code, timeout=120)
    assert run.returncode == 0 and "ok" in run.output, run.tail()
