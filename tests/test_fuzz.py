"""Random cases against float64: shapes, filter lengths, precisions, I/O dtypes, layouts,
the skip term, forward and backward. Seeded and printed; MONARCH_FFTCONV_TEST_SEED replays a
run. Every case must be within its precision's budget: no silent wrong result."""

import collections
import math
import os
import random
from dataclasses import dataclass

import pytest
import torch

import monarch_fftconv as mf

from monarch_fftconv.backends import TC_KERNEL_ENV

from helpers import BUDGETS, fp16_subnormal_error, reference

CASES = {"cpu": 200, "cuda": 500}
# Elements of u per case, and sequences (B·C) per case, at most.
ELEMENTS = {"cpu": 1 << 17, "cuda": 1 << 24}
SEQUENCES = {"cpu": 2_000, "cuda": 70_000}
MAX_LENGTH = {"cpu": 8192, "cuda": 300_000}  # GPU: fused to 16384, four-step to 131072, then cuFFT
# Storing y in a 16-bit type: up to half an ulp of rounding on top of the computed value's
# own error, allowed as one ulp (tiny cases have too few elements to average it out).
IO_ROUNDING = {torch.float32: 0.0, torch.float64: 0.0, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
GRAD_FACTOR = 1.5  # gradients: within 1.5x the forward budget
# Means added to u, half the cases centred, drawn from a stream of their own (so a seed's shapes,
# precisions and data are those it drew before means were added, in session 29): up to 64, inside
# every route's documented range for the draw's filters (|Σk| ~ 1). fp16's ceiling on the mma.sync
# kernel is a mean of min(65504/⌈L/M⌉, ~65504·N/(L·|Σk|)): 1023 at L = 8192 for such filters. The
# engine's, its filter's peak near 2^-7 (engine_traits.cuh's default since session 30), is the same
# on its CPU model through one tap and exp(-t/500), and there it meets the mma.sync kernel's error
# on the fuzz's own filters at means 64 and 256 (session 30).
MEANS = [0.0, 0.0, 0.0, 1.0, 8.0, 64.0]


def few_elements_factor(count: int) -> float:
    """A budget is a relative L2 error, which averages the roundings of many elements; a result
    of n elements spreads about it as 1/sqrt(n), and tf32's budget is only twice its unit
    roundoff (seed 780051602, case 60 as drawn before the means: one output, 1.04e-3 against 1e-3). Allowed: the budget
    times 1 + 1/sqrt(n): 2x for one element, 1.03x for a thousand. A wrong index or a lost term
    errs by O(1), far past either, in the centred half of the cases at least (a large mean makes
    y nearly constant, which a shift by one barely changes)."""
    return 1 + 1 / math.sqrt(max(count, 1))


@dataclass
class Case:
    batch: int
    channels: int
    length: int
    filter_len: int
    precision: str
    io_dtype: torch.dtype
    layout: str  # "contiguous" | "strided" (every other channel) | "transposed" (from (B, L, C))
    skip: bool
    backward: bool
    engine: str  # MONARCH_FFTCONV_BACKEND: "auto", or "portable" (the emulating engine)
    mean: float = 0.0  # added to u: activations are not centred, and a DC bin of B·L·mean tests each route's range
    tc_kernel: str = "mma"  # MONARCH_FFTCONV_TC_KERNEL: "engine" requests the tensor-core engine (GPU only)


def draw(rng: random.Random, device: str, means: random.Random) -> Case:
    length = min(MAX_LENGTH[device], int(math.exp(rng.uniform(0, math.log(MAX_LENGTH[device])))))
    sequences_cap = max(1, min(SEQUENCES[device], ELEMENTS[device] // length))
    sequences = int(math.exp(rng.uniform(0, math.log(sequences_cap))))
    channels = rng.randint(1, min(sequences, 64))
    dtypes = [torch.float32, torch.bfloat16, torch.float16] + ([torch.float64] if device == "cpu" else [])
    case = Case(
        batch=max(1, sequences // channels),
        channels=channels,
        length=length,
        filter_len=rng.randint(1, length),
        precision=rng.choice(list(BUDGETS)),
        io_dtype=rng.choice(dtypes),
        layout=rng.choice(["contiguous", "strided", "transposed"]),
        skip=rng.random() < 0.5,
        backward=rng.random() < 0.3,
        engine=rng.choice(["auto", "portable"]) if device == "cpu" else "auto",
        mean=means.choice(MEANS),
    )
    if device == "cuda":  # drawn last, so the CPU's draws (and its seeds' cases) are unchanged
        case.tc_kernel = rng.choice(["mma", "engine"])  # either kernel, any mean: both keep MEANS in range
    return case


def make_inputs(case: Case, gen: torch.Generator, device: str):
    b, c, n = case.batch, case.channels, case.length
    if case.layout == "strided":
        u = torch.randn(b, 2 * c, n, generator=gen)[:, ::2]
    elif case.layout == "transposed":
        u = torch.randn(b, n, c, generator=gen).transpose(1, 2)
    else:
        u = torch.randn(b, c, n, generator=gen)
    u.add_(case.mean)  # in place: the layout (a strided or transposed view) is what is drawn
    k = torch.randn(c, case.filter_len, generator=gen) / math.sqrt(case.filter_len)  # outputs of std ~1
    D = torch.randn(c, generator=gen) if case.skip else None
    u = u.to(device=device, dtype=case.io_dtype)
    return u, k.to(device), None if D is None else D.to(device)


def _forward_and_grads(u, k, D, g):
    """Float64 torch.fft autograd: [y] and, given g, [y, du, dk(, dD)]."""
    leaves = [t.detach().double().requires_grad_() for t in (u, k) + ((D,) if D is not None else ())]
    y = reference(*leaves)  # the tests' float64 reference, differentiable in its leaves
    if g is None:
        return [y.detach()]
    return [y.detach(), *torch.autograd.grad(y, leaves, g.double())]


def fft_rounding_scales(u, k, g) -> list[float]:
    """What rounding inside an FFT convolution scales with, for y, du and dk (dD has no FFT).
    A transform's error is spread evenly over its 2L outputs, with a norm proportional to the
    product of the two operands' norms (Parseval), whatever the result's own norm; the kept m
    outputs of each sequence carry m / 2L of it, and sequences add in quadrature. For dense
    random inputs this is about 0.7x the result's norm; it is larger where the result is small
    because the operands' weight does not overlap (a late spike in u, an early one in g)."""
    length, filter_len = u.shape[-1], k.shape[-1]
    u_norms, k_norms = u.detach().double().norm(dim=-1), k.detach().double().norm(dim=-1)

    def scale(a_norms, b_norms, kept):
        return math.sqrt(((a_norms * b_norms) ** 2).sum().item() * kept / (2 * length))

    scales = [scale(u_norms, k_norms, length)]
    if g is not None:
        g_norms = g.detach().double().norm(dim=-1)
        scales += [scale(g_norms, k_norms, length), scale(g_norms, u_norms, filter_len), 0.0]
    return scales


def fp16_subnormal_floors(u, k, g, fft_size: int) -> list[float]:
    """Absolute errors that fp16's subnormals leave in y, du and dk (README, "Precision"): the
    spectrum products, 1/N folded in, are rounded to fp16 operands, and below 2^-14 their
    spacing is a fixed 2^-24; an inverse transform of N such roundings puts about
    2^-24·sqrt(N/6) of error norm on each kept output. Twice that is allowed; it matters only
    for outputs so small (rms under ~3e-3 at N = 16384) that their products fall below fp16's
    range."""
    batch_channels, length, filter_len = u.numel() // u.shape[-1], u.shape[-1], k.shape[-1]

    def floor(kept, sequences):
        return 2 * fp16_subnormal_error(fft_size) * math.sqrt(kept * sequences)

    floors = [floor(length, batch_channels)]
    if g is not None:
        floors += [floor(length, batch_channels), floor(filter_len, k.shape[0]), 0.0]
    return floors


def reference_with_scales(u, k, D, g):
    """[(value, scale)] for y and the gradients. The scale is the value's norm, or, where
    larger, one of two floors. (1) The norm of the same computation on absolute values
    divided by the square root of the number of products in each sum: what random signs
    would leave. A sum that cancels beyond that (a short filter, a skip term offsetting the
    convolution) then does not turn rounding into a large relative error. (2) The FFT
    rounding scale above: a result that is small because its operands barely overlap is
    still computed from all of them. Any other case keeps the plain relative error."""
    absolute = [None if t is None else t.detach().double().abs() for t in (u, k, D, g)]
    batch, length, filter_len = u.numel() // (u.shape[-1] * u.shape[-2]), u.shape[-1], k.shape[-1]
    terms = [filter_len + 1, filter_len + 1, batch * length, batch * length]  # y, du, dk, dD
    values = _forward_and_grads(u, k, D, g)
    scales = [max(v.norm().item(), a.norm().item() / math.sqrt(n), fft)
              for v, a, n, fft in zip(values, _forward_and_grads(*absolute), terms, fft_rounding_scales(u, k, g))]
    return list(zip(values, scales))


def error(got: torch.Tensor, want: torch.Tensor, scale: float) -> float:
    return ((got.double() - want).norm() / scale).item()


def run_case(case: Case, gen: torch.Generator, device: str) -> tuple[str, list[str]]:
    """(backend, what went wrong); an empty list means within every budget."""
    os.environ["MONARCH_FFTCONV_BACKEND"] = case.engine
    os.environ[TC_KERNEL_ENV] = case.tc_kernel
    u, k, D = make_inputs(case, gen, device)
    inputs = [u, k] + ([D] if D is not None else [])
    if case.backward:
        for t in inputs:
            t.requires_grad_()
    y = mf.fftconv(u, k, D=D, precision=case.precision)
    explained = mf.explain(u, k, D=D, precision=case.precision)
    backend = explained["backend"] + (" (engine)" if "engine" in explained["kernel"] else "")
    g = torch.randn(y.shape, generator=gen).to(device=device, dtype=y.dtype) if case.backward else None
    wanted = reference_with_scales(u, k, D, g)
    budget = BUDGETS[case.precision] + IO_ROUNDING[case.io_dtype]
    budgets = [factor * budget * few_elements_factor(value.numel())  # y, du, dk, dD
               for factor, (value, _) in zip([1.0] + [GRAD_FACTOR] * 3, wanted)]
    if case.precision == "fp16" and explained["backend"] in ("portable", "cuda-tensor-core"):
        floors = fp16_subnormal_floors(u, k, g, explained["fft_size"])
        if explained["backend"] == "cuda-tensor-core":  # its backward is the fp32 grad kernel's: no floor
            floors = floors[:1] + [0.0] * (len(floors) - 1)
        wanted = [(value, max(scale, floor / b)) for (value, scale), floor, b in zip(wanted, floors, budgets)]
    problems = []
    if y.dtype != u.dtype or y.shape != u.shape:
        problems.append(f"y is {y.dtype} {tuple(y.shape)}")
    if not (err := error(y, *wanted[0])) <= budgets[0]:  # `not <=` also catches NaN
        problems.append(f"y error {err:.2e} > {budgets[0]:.1e}")
    if case.backward:
        grads = torch.autograd.grad(y, inputs, g)
        for name, got, want, allowed in zip("ukD", grads, wanted[1:], budgets[1:]):
            if not (err := error(got, *want)) <= allowed:
                problems.append(f"d{name} error {err:.2e} > {allowed:.1e}")
    return backend, problems


def fuzz(device: str) -> None:
    seed = int(os.environ.get("MONARCH_FFTCONV_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"fuzz on {device}: {CASES[device]} cases, seed={seed} (replay: MONARCH_FFTCONV_TEST_SEED={seed})")
    rng, gen, means = random.Random(seed), torch.Generator().manual_seed(seed), random.Random(~seed)
    by_backend, failures = collections.Counter(), []
    for index in range(CASES[device]):
        case = draw(rng, device, means)
        backend, problems = run_case(case, gen, device)
        by_backend[backend] += 1
        if problems:
            failures.append(f"case {index} {case} on {backend}: {'; '.join(problems)}")
    print(f"fuzz summary ({device}): {CASES[device]} cases, {len(failures)} wrong; by backend: {dict(by_backend)}")
    assert not failures, "\n".join(failures[:20])


def test_fuzz_cpu(monkeypatch):
    monkeypatch.setenv("MONARCH_FFTCONV_BACKEND", "auto")  # restored after the test
    monkeypatch.setenv(TC_KERNEL_ENV, "mma")
    fuzz("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fuzz_cuda(monkeypatch):
    monkeypatch.setenv("MONARCH_FFTCONV_BACKEND", "auto")
    monkeypatch.setenv(TC_KERNEL_ENV, "mma")  # each case sets its own; restored after the test
    fuzz("cuda")


def test_the_fft_rounding_floor_sits_below_dense_results_and_above_non_overlapping_ones():
    """The floor must not loosen the budget for ordinary inputs (it stays under the result's
    norm when the operands overlap), must cover the case that is small only because they do
    not overlap, and must leave a shifted result far outside every budget."""
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    u, k, g = torch.randn(3, 5, 301, generator=gen), torch.randn(5, 97, generator=gen), torch.randn(3, 5, 301, generator=gen)
    values = _forward_and_grads(u, k, None, g)
    for value, floor in zip(values, fft_rounding_scales(u, k, g)):
        assert 0.4 * value.norm() < floor < 1.0 * value.norm()
    # u's weight at the end, g's at the start: dk = sum_t g[t + s] u[t] barely overlaps.
    u, g = torch.zeros(1, 1, 64), torch.zeros(1, 1, 64)
    u[..., -1], u[..., 0], g[..., 0], g[..., -1] = 2.0, 0.03, 1.8, -0.1
    k = torch.randn(1, 64, generator=gen)
    dk = _forward_and_grads(u, k, None, g)[2]
    assert fft_rounding_scales(u, k, g)[2] > 10 * dk.norm()
    y, scale = reference_with_scales(torch.randn(2, 3, 129, generator=gen), torch.randn(3, 40, generator=gen), None, None)[0]
    assert error(torch.roll(y, 1, dims=-1), y, scale) > 30 * max(BUDGETS.values())


def test_tiny_cases_meet_their_allowances_and_a_lost_tap_does_not(monkeypatch):
    """Where the allowances matter most, L ≤ 8 (every floor and 1 + 1/sqrt(n) near their
    largest): 400 random tiny cases of every precision, mean and direction pass; and the same
    check still fails a result that lost its filter's last tap in at least 90% of tiny cases
    (the rest: a last tap small by chance, under bf16's budget)."""
    monkeypatch.setenv("MONARCH_FFTCONV_BACKEND", "portable")
    monkeypatch.setenv(TC_KERNEL_ENV, "mma")
    seed = int.from_bytes(os.urandom(4), "little")
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    failures = []
    for _ in range(400):
        length = rng.randint(1, 8)
        case = Case(batch=rng.randint(1, 3), channels=rng.randint(1, 3), length=length,
                    filter_len=rng.randint(1, length), precision=rng.choice(list(BUDGETS)),
                    io_dtype=torch.float32, layout="contiguous", skip=rng.random() < 0.5,
                    backward=rng.random() < 0.5, engine="portable", mean=rng.choice(MEANS))
        if (problems := run_case(case, gen, "cpu")[1]):
            failures.append(f"{case}: {problems}")
    assert not failures, f"seed {seed}: " + "\n".join(failures[:5])
    caught = 0
    for _ in range(200):
        length, precision = rng.randint(2, 8), rng.choice(list(BUDGETS))
        filter_len = rng.randint(2, length)
        u = torch.randn(rng.randint(1, 3), 2, length, generator=gen)
        k = torch.randn(2, filter_len, generator=gen) / math.sqrt(filter_len)
        (value, scale), = reference_with_scales(u, k, None, None)
        lost = mf.fftconv(u, k[:, :-1].contiguous(), precision=precision)
        caught += error(lost, value, scale) > BUDGETS[precision] * few_elements_factor(value.numel())
    assert caught >= 180, f"seed {seed}: a lost tap caught in {caught} of 200 tiny cases"
