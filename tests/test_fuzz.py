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

from helpers import BUDGETS, reference

CASES = {"cpu": 200, "cuda": 500}
# Elements of u per case, and sequences (B·C) per case, at most.
ELEMENTS = {"cpu": 1 << 17, "cuda": 1 << 24}
SEQUENCES = {"cpu": 2_000, "cuda": 70_000}
MAX_LENGTH = {"cpu": 8192, "cuda": 300_000}  # GPU: fused to 16384, four-step to 131072, then cuFFT
# Storing y in a 16-bit type: up to half an ulp of rounding on top of the computed value's
# own error, allowed as one ulp (tiny cases have too few elements to average it out).
IO_ROUNDING = {torch.float32: 0.0, torch.float64: 0.0, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
GRAD_FACTOR = 1.5  # gradients: within 1.5x the forward budget


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
    tc_kernel: str = "mma"  # MONARCH_FFTCONV_TC_KERNEL: "engine" requests the tensor-core engine (GPU only)


def draw(rng: random.Random, device: str) -> Case:
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
    )
    if device == "cuda":  # drawn last, so the CPU's draws (and its seeds' cases) are unchanged
        case.tc_kernel = rng.choice(["mma", "engine"])
    return case


def make_inputs(case: Case, gen: torch.Generator, device: str):
    b, c, n = case.batch, case.channels, case.length
    if case.layout == "strided":
        u = torch.randn(b, 2 * c, n, generator=gen)[:, ::2]
    elif case.layout == "transposed":
        u = torch.randn(b, n, c, generator=gen).transpose(1, 2)
    else:
        u = torch.randn(b, c, n, generator=gen)
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


def reference_with_scales(u, k, D, g):
    """[(value, scale)] for y and the gradients. The scale is the value's norm, or, where
    that is smaller, the norm of the same computation on absolute values divided by the
    square root of the number of products in each sum: what random signs would leave.
    A sum that cancels beyond that (a short filter, a skip term offsetting the convolution)
    then does not turn rounding into a large relative error; any other case keeps the
    plain relative error."""
    absolute = [None if t is None else t.detach().double().abs() for t in (u, k, D, g)]
    batch, length, filter_len = u.numel() // (u.shape[-1] * u.shape[-2]), u.shape[-1], k.shape[-1]
    terms = [filter_len + 1, filter_len + 1, batch * length, batch * length]  # y, du, dk, dD
    values = _forward_and_grads(u, k, D, g)
    scales = [max(v.norm(), a.norm() / math.sqrt(n))
              for v, a, n in zip(values, _forward_and_grads(*absolute), terms)]
    return list(zip(values, scales))


def error(got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor) -> float:
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
    problems = []
    if y.dtype != u.dtype or y.shape != u.shape:
        problems.append(f"y is {y.dtype} {tuple(y.shape)}")
    if not (err := error(y, *wanted[0])) <= budget:  # `not <=` also catches NaN
        problems.append(f"y error {err:.2e} > {budget:.1e}")
    if case.backward:
        grads = torch.autograd.grad(y, inputs, g)
        for name, got, want in zip("ukD", grads, wanted[1:]):
            if not (err := error(got, *want)) <= GRAD_FACTOR * budget:
                problems.append(f"d{name} error {err:.2e} > {GRAD_FACTOR * budget:.1e}")
    return backend, problems


def fuzz(device: str) -> None:
    seed = int(os.environ.get("MONARCH_FFTCONV_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"fuzz on {device}: {CASES[device]} cases, seed={seed} (replay: MONARCH_FFTCONV_TEST_SEED={seed})")
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    by_backend, failures = collections.Counter(), []
    for index in range(CASES[device]):
        case = draw(rng, device)
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
