"""The public functions: `fftconv` and `explain`, with their input checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from . import policy
from .backends import Backend, select_backend
from .planner import compute_dtype, plan_for

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class ArgNames:
    """What error messages call the arguments: the function's names, or the module's."""

    u: str = "u"
    k: str = "k"
    D: str = "D"


FUNCTION_NAMES = ArgNames()


def check_inputs(u: object, k: object, D: object = None, names: ArgNames = FUNCTION_NAMES) -> None:
    """Raise TypeError/ValueError naming the problem; compute nothing. u is (..., C, L)."""
    for name, t in ((names.u, u), (names.k, k)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{name} must be a real floating-point tensor (float16/bfloat16/float32/float64), got {t.dtype}")
    assert isinstance(u, Tensor) and isinstance(k, Tensor)
    if u.dim() < 2:
        raise ValueError(f"{names.u} must have shape (..., C, L), got {tuple(u.shape)}")
    if k.dim() != 2:
        raise ValueError(f"{names.k} must have shape (C, Lk), got {tuple(k.shape)}")
    channels, length = u.shape[-2:]
    if 0 in (channels, length) or k.numel() == 0:  # an empty batch is fine: an empty result
        raise ValueError(f"empty dimension: {names.u} {tuple(u.shape)}, {names.k} {tuple(k.shape)}")
    if k.shape[0] != channels:
        raise ValueError(f"channel mismatch: {names.u} has {channels} channels, {names.k} has {k.shape[0]}")
    if k.shape[1] > length:
        raise ValueError(f"{names.k} longer than the sequence: Lk={k.shape[1]} > L={length}")
    if k.device != u.device:
        raise ValueError(f"{names.u} and {names.k} are on different devices: {u.device} and {k.device}")
    if D is not None:
        if not isinstance(D, Tensor):
            raise TypeError(f"{names.D} must be a torch.Tensor or None, got {type(D).__name__}")
        if D.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{names.D} must be a real floating-point tensor, got {D.dtype}")
        if tuple(D.shape) != (channels,):
            raise ValueError(f"{names.D} must have shape ({channels},), got {tuple(D.shape)}")
        if D.device != u.device:
            raise ValueError(f"{names.u} and {names.D} are on different devices: {u.device} and {D.device}")


def fftconv(u: Tensor, k: Tensor, *, D: Tensor | None = None, precision: str | None = None) -> Tensor:
    """Causal long convolution over each channel.

    y[b, c, t] = Σ_{s<=t} k[c, s]·u[b, c, t-s]  (+ D[c]·u[b, c, t]),

    u: (B, C, L), or (C, L), or (..., C, L) with any leading dims; k: (C, Lk) with
    1 <= Lk <= L; D: optional (C,). Returns y of u's shape and dtype, differentiable in u, k
    and D. `precision` is "fp32", "tf32", "bf16", "fp16" or
    None (see `monarch_fftconv.policy` for how None is resolved).
    """
    return conv(u, k, D, precision)


SpectrumCache = Callable[[Backend, Tensor, str], Tensor]


def conv(
    u: Tensor,
    k: Tensor,
    D: Tensor | None,
    precision: str | None,
    module_precision: str | None = None,
    cached_spectrum: SpectrumCache | None = None,
    names: ArgNames = FUNCTION_NAMES,
) -> Tensor:
    """The one call path, for `fftconv` and `FFTConv`: check, resolve the precision, pick
    the backend, run it. `cached_spectrum(backend, k, precision)` (a module inside an
    `inference_cache()` block) supplies k's spectrum when autograd is not recording. A
    compiled graph computes the spectrum in the graph instead: the cache's checks are
    host-side state that torch.compile cannot trace, and the graph then follows every filter
    update."""
    check_inputs(u, k, D, names)
    shape = u.shape
    if u.numel() == 0:
        return _empty_batch(u, k, D)
    batched = u.dim() == 3
    if not batched:
        u = u.reshape(-1, *shape[-2:])  # (..., C, L) -> (B, C, L): a view unless the strides forbid
    chosen, _ = policy.resolve(precision, u.dtype, module_precision)
    backend = select_backend(u.device, u.dtype, chosen, plan_for(u.shape[-1]), u.shape[0] * u.shape[1])
    skip = None if D is None else D.to(compute_dtype(u))
    if cached_spectrum is not None and not _records_grad(u, k, D) and not torch.compiler.is_compiling():
        y = backend.conv(u, cached_spectrum(backend, k, chosen), skip, chosen)
    else:
        y = backend.fftconv(u, k, skip, chosen)
    return y if batched else y.reshape(shape)


def _empty_batch(u: Tensor, k: Tensor, D: Tensor | None) -> Tensor:
    """y for an empty batch: empty, in u's dtype, with zero gradients for k and D (their sum
    over no sequences), as autograd gives them for any other batch. (torch.fft itself
    fails on an empty batch on CPU.)"""
    weights = k.sum() if D is None else k.sum() + D.sum()
    return u * weights.to(u.dtype) * 0


def _records_grad(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def explain(u: Tensor, k: Tensor, *, D: Tensor | None = None, precision: str | None = None) -> dict[str, Any]:
    """Which backend and kernel `fftconv(u, k, D=D, precision=precision)` would use, and why.
    Never builds the CUDA extension: before the first CUDA call has loaded it, the backend
    is "pending".

    Keys: backend, kernel, reason, precision (the flag: "fp32" means fp32-accurate or better),
    precision_source, arithmetic (what the kernel computes in: "fp64" for float64 input on
    torch.fft, "fp32" when the fp32 kernel serves a bf16 call; None when pending), fft_size, factors, flops
    (real flops of one forward call as the chosen algorithm does it; None when pending),
    stages (the CUDA launches of one forward call in order, each {"stage", "reads", "writes"}
    with the HBM bytes it moves at least; None for torch.fft and when pending)."""
    check_inputs(u, k, D)
    chosen, source = policy.resolve(precision, u.dtype, None)
    plan = plan_for(u.shape[-1])
    channels = u.shape[-2]
    batch = u.numel() // (channels * u.shape[-1])
    backend = select_backend(u.device, u.dtype, chosen, plan, batch * channels, build=False)
    return {
        "backend": backend.name,
        "kernel": backend.kernel,
        "reason": backend.reason,
        "precision": chosen,
        "precision_source": source,
        "arithmetic": backend.arithmetic(chosen, u.dtype),
        "fft_size": plan.fft_size,
        "factors": plan.factors,
        "flops": backend.flops(plan, batch, channels),
        "stages": backend.stages(plan, batch, channels, u.element_size()),
    }
