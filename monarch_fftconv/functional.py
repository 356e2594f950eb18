"""The public functions: `fftconv` and `explain`, with their input checks."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from . import ops, policy
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
    return _fftconv(u, k, D, precision, module_precision=None)


def _fftconv(u: Tensor, k: Tensor, D: Tensor | None, precision: str | None, module_precision: str | None) -> Tensor:
    check_inputs(u, k, D)
    chosen, _ = policy.resolve(precision, u.dtype, module_precision)
    skip = None if D is None else D.to(compute_dtype(u))
    return ops.fftconv(u, k, skip, chosen)


def _forward_flops(backend: str, plan, batch: int, channels: int) -> int:
    """Real flops of one forward call as the chosen algorithm does them (one FMA = 2)."""
    n, sequences = plan.fft_size, batch * channels
    # A radix FFT of N real points costs ~2.5·N·log2(N). On GPUs the filter spectrum is one
    # cuFFT per channel; the portable engine transforms the filter with its own stages.
    real_fft = 2.5 * n * (n.bit_length() - 1)
    if backend == "portable":
        return plan.flops_per_sequence() * sequences + plan.flops_per_sequence() // 2 * channels
    if backend == "cuda-tensor-core":  # MMA flops as issued: padded tiles, conjugate columns
        per_sequence = plan.tensor_core_flops_per_sequence()
    else:  # radix FFTs (cuFFT, the fp32 kernel): forward, inverse, complex product
        per_sequence = 2 * real_fft + 6 * (n // 2 + 1)
    return int(sequences * per_sequence + channels * real_fft)


def explain(u: Tensor, k: Tensor, *, D: Tensor | None = None, precision: str | None = None) -> dict[str, Any]:
    """Which backend and kernel `fftconv(u, k, D=D, precision=precision)` would use, and why.

    Keys: backend, kernel, reason, precision, precision_source, fft_size, factors, flops
    (real flops of one forward call as the chosen algorithm does it)."""
    check_inputs(u, k, D)
    chosen, source = policy.resolve(precision, u.dtype, None)
    plan = plan_for(u.shape[-1])
    backend = ops.select_backend(u.device, u.dtype, chosen, plan)
    batch, channels, _ = u.shape
    flops = _forward_flops(backend.name, plan, batch, channels)
    return {
        "backend": backend.name,
        "kernel": backend.kernel,
        "reason": backend.reason,
        "precision": chosen,
        "precision_source": source,
        "fft_size": plan.fft_size,
        "factors": plan.factors,
        "flops": flops,
    }
