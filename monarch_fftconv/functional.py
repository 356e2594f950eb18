"""The public functions: `fftconv` and `explain`, with their input checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from . import policy
from .backends import Backend, select_backend
from .planner import compute_dtype, plan_for

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_inputs(u: object, k: object, D: object = None) -> None:
    """Raise TypeError/ValueError naming the problem; compute nothing."""
    for name, t in (("u", u), ("k", k)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{name} must be a real floating-point tensor (float16/bfloat16/float32/float64), got {t.dtype}")
    assert isinstance(u, Tensor) and isinstance(k, Tensor)
    if u.dim() != 3:
        raise ValueError(f"u must have shape (B, C, L), got {tuple(u.shape)}")
    if k.dim() != 2:
        raise ValueError(f"k must have shape (C, Lk), got {tuple(k.shape)}")
    batch, channels, length = u.shape
    if 0 in (batch, channels, length) or k.shape[1] == 0:
        raise ValueError(f"empty dimension: u {tuple(u.shape)}, k {tuple(k.shape)}")
    if k.shape[0] != channels:
        raise ValueError(f"channel mismatch: u has {channels} channels, k has {k.shape[0]}")
    if k.shape[1] > length:
        raise ValueError(f"filter longer than the sequence: Lk={k.shape[1]} > L={length}")
    if k.device != u.device:
        raise ValueError(f"u and k are on different devices: {u.device} and {k.device}")
    if D is not None:
        if not isinstance(D, Tensor):
            raise TypeError(f"D must be a torch.Tensor or None, got {type(D).__name__}")
        if D.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"D must be a real floating-point tensor, got {D.dtype}")
        if tuple(D.shape) != (channels,):
            raise ValueError(f"D must have shape ({channels},), got {tuple(D.shape)}")
        if D.device != u.device:
            raise ValueError(f"u and D are on different devices: {u.device} and {D.device}")


def fftconv(u: Tensor, k: Tensor, *, D: Tensor | None = None, precision: str | None = None) -> Tensor:
    """Causal long convolution over each channel.

    y[b, c, t] = Σ_{s<=t} k[c, s]·u[b, c, t-s]  (+ D[c]·u[b, c, t]),

    u: (B, C, L); k: (C, Lk) with 1 <= Lk <= L; D: optional (C,). Returns (B, C, L) in u's
    dtype, differentiable in u, k and D. `precision` is "fp32", "tf32", "bf16", "fp16" or
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
) -> Tensor:
    """The one call path, for `fftconv` and `FFTConv`: check, resolve the precision, pick
    the backend, run it. `cached_spectrum(backend, k, precision)` (the module's cache)
    supplies k's spectrum when autograd is not recording."""
    check_inputs(u, k, D)
    chosen, _ = policy.resolve(precision, u.dtype, module_precision)
    backend = select_backend(u.device, u.dtype, chosen, plan_for(u.shape[-1]))
    skip = None if D is None else D.to(compute_dtype(u))
    if cached_spectrum is not None and not _records_grad(u, k, D):
        return backend.conv(u, cached_spectrum(backend, k, chosen), skip, chosen)
    return backend.fftconv(u, k, skip, chosen)


def _records_grad(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def explain(u: Tensor, k: Tensor, *, D: Tensor | None = None, precision: str | None = None) -> dict[str, Any]:
    """Which backend and kernel `fftconv(u, k, D=D, precision=precision)` would use, and why.
    Never builds the CUDA extension: before the first CUDA call has loaded it, the backend
    is "pending".

    Keys: backend, kernel, reason, precision, precision_source, fft_size, factors, flops
    (real flops of one forward call as the chosen algorithm does it; None when pending)."""
    check_inputs(u, k, D)
    chosen, source = policy.resolve(precision, u.dtype, None)
    plan = plan_for(u.shape[-1])
    backend = select_backend(u.device, u.dtype, chosen, plan, build=False)
    batch, channels, _ = u.shape
    return {
        "backend": backend.name,
        "kernel": backend.kernel,
        "reason": backend.reason,
        "precision": chosen,
        "precision_source": source,
        "fft_size": plan.fft_size,
        "factors": plan.factors,
        "flops": backend.flops(plan, batch, channels),
    }
