"""Validity of every row, measured in the same run.

Accuracy: relative L2 error of a method's outputs (y, and with --backward the grads of every
differentiable input) against torch.fft in float64 on the same inputs (for the Hyena operators
written apart from the methods' forms, float64_operator), allclose(atol=1e-2, rtol=1e-2), and
for monarch methods the error budget of the precision the call ran at
(monarch_fftconv.policy.ERROR_BUDGETS), plus, with half-precision I/O, the rounding of y to the
I/O dtype (IO_ROUNDING).
Time: the memory floor, compulsory bytes / measured copy bandwidth; a time under it is a
measurement or correctness bug, so the row is INVALID and gets no speedup. And the spread: a row
whose inter-quartile range exceeds MAX_SPREAD of its median, on either clock (on the host, where
both clocks time the same loop, also one whose two medians are that far apart), is NOISY: its
median could move by that much on a rerun, so it gets no speedup either. So is a host row whose
threads were several while other processes held the cores they needed.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

import torch

from fftconv_bench.methods import ERROR_BUDGETS, reference_conv
from fftconv_bench.timing import MAX_SPREAD, relative_gap

ATOL = RTOL = 1e-2
# Storing y in a 16-bit I/O dtype rounds it by up to half an ulp, a relative error of 2^-8
# (bfloat16) or 2^-11 (float16) on top of the arithmetic's: added to the precision's budget,
# as tests/test_cuda.py does for half I/O.
IO_ROUNDING = {torch.float32: 0.0, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
# Cores that other processes may keep busy beyond those the run leaves free (daemons).
OTHER_LOAD_MARGIN = 0.25
# Verdicts of a row's timings, worst first; speedups are claimed for TRUSTED ones only.
VERDICTS = ("INVALID", "NOISY", "OK", "UNCHECKED")
TRUSTED = ("OK", "UNCHECKED")
# The float64 outputs: "y", then with --backward the grad of each input by its name (u, k, and
# D, pregate, postgate where the operator takes them), in the order a training step returns them.
Outputs64 = Dict[str, torch.Tensor]


def min_bytes(B: int, C: int, L: int, *, backward: bool, elem: int = 4,
              filter_rows: Optional[int] = None, gates: int = 0, skip: bool = False) -> int:
    """Compulsory DRAM traffic of one call: the memory floor's numerator.

    forward: u read + k read + y written. forward+backward: additionally grad_y read, grad_u and
    grad_k written (u and k counted once: an ideal fused implementation reads them once).
    `elem`: bytes per element of the I/O dtype (every tensor read or written is in it).
    The operators: `filter_rows` rows of length L in the filter bank (C by default; C/16
    grouped, 2C bidirectional); `gates` tensors of u's shape read (their grads written with
    backward); `skip`: D (C,) read (its grad written).
    """
    activations = B * C * L * (2 + gates + (2 + gates if backward else 0))
    weights = L * (C if filter_rows is None else filter_rows) + (C if skip else 0)
    return elem * (activations + weights * (2 if backward else 1))


def validate_time(time_s: Optional[float], floor_s: Optional[float]) -> str:
    """'INVALID' if a measured time is under the memory floor (faster than just moving the
    compulsory bytes at the measured copy bandwidth: a timing or correctness bug, not a win),
    'OK' otherwise, 'UNCHECKED' when there is no floor or no time."""
    if time_s is None or floor_s is None or not math.isfinite(floor_s) or floor_s <= 0:
        return "UNCHECKED"
    if not math.isfinite(time_s) or time_s < floor_s:
        return "INVALID"
    return "OK"


def validate_spread(relative_spread: Optional[float], max_spread: float = MAX_SPREAD) -> str:
    """'NOISY' if the spread exceeds `max_spread`, 'OK' otherwise, 'UNCHECKED' without one."""
    if relative_spread is None:
        return "UNCHECKED"
    return "OK" if relative_spread <= max_spread else "NOISY"


def validate_other_load(other_cores: Optional[float], threads: int, cores: int) -> str:
    """'NOISY' if the run has several threads and other processes kept busy more of the host's
    cores than those threads left free (plus OTHER_LOAD_MARGIN for daemons): every parallel
    region then waits a scheduler slice for a core (0.15 ms calls took 24-48 ms here). One
    thread has no region to wait at, and its median survives the odd preemption: 'OK'.
    'UNCHECKED' without a figure."""
    if other_cores is None:
        return "UNCHECKED"
    if threads <= 1:
        return "OK"
    return "OK" if other_cores <= max(0, cores - threads) + OTHER_LOAD_MARGIN else "NOISY"


def worst_validity(*verdicts: str) -> str:
    """The first of VERDICTS among them (INVALID, then NOISY, then OK): one verdict for
    several checks of one row."""
    return next((v for v in VERDICTS if v in verdicts), "UNCHECKED")


def measure_error(out: torch.Tensor, ref: torch.Tensor, *, atol: float = ATOL,
                  rtol: float = RTOL) -> Dict[str, Any]:
    """Relative L2 error of `out` vs the float64 `ref`, and torch.allclose(atol, rtol)."""
    out64 = out.detach().to(torch.float64)
    ref64 = ref.detach().to(torch.float64)
    if out64.shape != ref64.shape:
        return {"rel_err": float("nan"), "max_abs_err": float("nan"), "allclose": False,
                "shape_mismatch": f"{tuple(out64.shape)} vs {tuple(ref64.shape)}"}
    finite = bool(torch.isfinite(out64).all())
    ref_norm = torch.linalg.vector_norm(ref64).item()
    err_norm = torch.linalg.vector_norm(out64 - ref64).item()
    rel = err_norm / ref_norm if ref_norm > 0 else err_norm
    return {"rel_err": rel if finite else float("inf"),
            "max_abs_err": (out64 - ref64).abs().max().item() if finite else float("inf"),
            "allclose": finite and bool(torch.allclose(out64, ref64, atol=atol, rtol=rtol))}


def float64_operator(u: torch.Tensor, k: torch.Tensor, D: Optional[torch.Tensor] = None,
                     pregate: Optional[torch.Tensor] = None,
                     postgate: Optional[torch.Tensor] = None) -> torch.Tensor:
    """postgate ⊙ (conv(x, k) + D ⊙ x), x = pregate ⊙ u, written apart from the methods' forms:
    the channels viewed as (G, C/G) groups, each broadcasting its filter (not repeated per
    channel); a bidirectional filter's anti-causal half as the causal convolution of the
    time-reversed x, reversed (not a conjugate spectrum)."""
    x = u if pregate is None else pregate * u
    groups = k.shape[0]
    grouped = x.unflatten(-2, (groups, x.shape[-2] // groups))   # (..., G, C/G, L)
    filters = k.unsqueeze(1)                                      # (G, 1, L) or (G, 1, 2, L)
    if k.dim() == 3:
        y = (reference_conv(grouped, filters[..., 0, :])
             + reference_conv(grouped.flip(-1), filters[..., 1, :]).flip(-1))
    else:
        y = reference_conv(grouped, filters)
    y = y.flatten(-3, -2)
    if D is not None:
        y = y + D.unsqueeze(-1) * x
    return y if postgate is None else postgate * y


def float64_reference(u: torch.Tensor, k: torch.Tensor, g: Optional[torch.Tensor],
                      **terms: torch.Tensor) -> Outputs64:
    """y (and with g the grads of u, k and the terms) by torch.fft in float64 on the same
    inputs: the values the methods take, already rounded to the I/O dtype, so that a method's
    error is its own arithmetic's. The plain convolution by reference_conv, the operators
    (terms, grouped or bidirectional filters) by float64_operator."""
    inputs = {"u": u, "k": k, **terms}
    inputs64 = {name: t.detach().to(torch.float64).requires_grad_(g is not None)
                for name, t in inputs.items()}
    plain = not terms and k.dim() == 2 and k.shape[0] == u.shape[-2]
    with torch.set_grad_enabled(g is not None):
        y = (reference_conv if plain else float64_operator)(*inputs64.values())
        if g is None:
            return {"y": y.detach()}
        grads = torch.autograd.grad(y, tuple(inputs64.values()), g.to(torch.float64))
    return {"y": y.detach(), **dict(zip(inputs64, grads))}


def outputs_error(outs: Any, refs: Outputs64) -> Dict[str, Any]:
    """Error fields for one method's outputs (y, or (y, grad_u, grad_k, *the terms' grads))
    vs float64: rel_err, allclose, and grad_<input>_rel_err, grad_<input>_allclose."""
    if not isinstance(outs, (tuple, list)):
        outs = (outs,)
    fields = measure_error(outs[0], refs["y"])
    grad_refs = [(name, ref) for name, ref in refs.items() if name != "y"]
    if len(outs) - 1 != len(grad_refs):  # a missing gradient must not pass as checked
        raise ValueError(f"the call returned {len(outs) - 1} gradients, the reference has {len(grad_refs)}: "
                         f"{[name for name, _ in grad_refs]}")
    # Gradients: relative L2 error; allclose on each gradient scaled by its float64 RMS, since
    # grad_k sums B·L products and has no natural O(1) scale for an absolute tolerance.
    for (name, ref), out in zip(grad_refs, outs[1:]):
        rms = ref.pow(2).mean().sqrt().clamp_min(1e-300)
        err = measure_error(out.to(torch.float64) / rms, ref / rms)
        fields[f"grad_{name}_rel_err"] = err["rel_err"]
        fields[f"grad_{name}_allclose"] = err["allclose"]
    return fields


def error_budget_fields(family: str, precision: Optional[str], rel_err: Optional[float],
                        io_dtype: torch.dtype = torch.float32) -> Dict[str, Any]:
    """A monarch row's error budget (that of the precision its call ran at, plus the rounding of
    y to a half-precision `io_dtype`) and whether the relative L2 error of y is within it;
    nothing for the torch.fft methods."""
    budget = ERROR_BUDGETS.get(precision) if family == "monarch" else None
    if budget is None:
        return {"error_budget": None, "within_error_budget": None}
    budget += IO_ROUNDING[io_dtype]
    within = rel_err is not None and math.isfinite(rel_err) and rel_err <= budget
    return {"error_budget": budget, "within_error_budget": within}


def grad_names(row: Dict[str, Any]) -> List[str]:
    """The inputs whose grads the row checked, in order: ['u', 'k'] (and D, pregate,
    postgate with --operator gated) with --backward, [] forward only."""
    return [key[len("grad_"):-len("_rel_err")] for key in row
            if key.startswith("grad_") and key.endswith("_rel_err")]


def is_accurate(row: Dict[str, Any]) -> bool:
    """allclose on y and, with --backward, on every grad."""
    return bool(row.get("allclose")) and all(row.get(f"grad_{name}_allclose")
                                             for name in grad_names(row))


def assign_speedups(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """speedup_vs_reference (back-to-back) and latency_speedup_vs_reference on every row of one
    shape: reference median / row median, against the reference row of the same training step,
    only where both timings are trusted (error, INVALID and NOISY rows, or such a reference:
    None)."""
    def trusted(r):
        return r is not None and r["status"] == "ok" and r.get("validity") in TRUSTED

    for r in rows:
        reference = next((ref for ref in rows if ref.get("family") == "reference"
                          and ref.get("train_step") == r.get("train_step")), None)
        ok = trusted(r) and trusted(reference)
        for field, median in (("speedup_vs_reference", "median_ms"),
                              ("latency_speedup_vs_reference", "latency_median_ms")):
            r[field] = reference[median] / r[median] if ok else None
    return list(rows)


def mark_same_computations(rows: Sequence[Dict[str, Any]], max_spread: float = MAX_SPREAD) -> None:
    """same_computation_as on every row of one shape that runs what an earlier row runs: the
    same entry point (precision aside), training step, backend and kernel. On the CPU every
    monarch precision runs the same torch.fft code, as on the GPU a precision that its policy
    sends to the fp32 kernel runs that kernel: their times should differ by noise alone. Where
    they differ by more than `max_spread`, the machine changed between the two rows (another
    process started, a clock moved): the later row becomes NOISY and says so. The earlier one
    was logged as it finished (results.jsonl) and stays as logged; the reason names it."""
    first: Dict[tuple, Dict[str, Any]] = {}
    for r in rows:
        r["same_computation_as"] = None
        if r["status"] != "ok" or not r.get("kernel"):
            continue
        key = (r.get("entry"), r.get("train_step"), r.get("backend"), r.get("kernel"))
        if key not in first:
            first[key] = r
            continue
        twin = first[key]
        r["same_computation_as"] = twin["method"]
        if relative_gap(r["median_ms"], twin["median_ms"]) > max_spread:
            why = (f"the same code as {twin['method']} timed {r['median_ms']:.4g} against "
                   f"{twin['median_ms']:.4g} ms (the machine changed between the rows)")
            if r.get("validity") in TRUSTED:
                r["validity"] = "NOISY"
            # Called again after each later row of the shape: the reason goes in once.
            if why not in (r.get("noisy_because") or ""):
                r["noisy_because"] = "; ".join(filter(None, (r.get("noisy_because"), why)))
