"""torch.library custom ops, their fake (meta) kernels, autograd, and backend selection.

Ops (all in the ``monarch_fftconv`` namespace):
- ``filter_spectrum(k, seq_len, precision)``: (C, R, M, 2) float Monarch-layout spectrum / N;
- ``conv_forward(u, filter_spectrum, skip, precision)``: y from a precomputed spectrum;
- ``fftconv(u, k, skip, precision)``: the differentiable convolution (autograd registered);
- ``fftconv_backward(grad, u, k, skip, precision)``: (du, dk, dskip).

Every op has one implementation for all devices, which picks a backend with `select_backend`
(the CUDA kernels, torch.fft, or the portable engine). Fake kernels make them traceable by
torch.compile(fullgraph=True).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from . import _extension, fft_fallback, portable
from .planner import MonarchPlan, compute_dtype, plan_for

PRECISION_CODES = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 3}
IO_TYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


@dataclass(frozen=True)
class Backend:
    name: str  # "cuda-tensor-core" | "cuda-fp32" | "torch.fft" | "portable"
    kernel: str  # what runs, in words
    reason: str  # why this backend


def select_backend(device: torch.device, dtype: torch.dtype, precision: str, plan: MonarchPlan) -> Backend:
    """The single place that decides where a call runs (also behind `explain`)."""
    factors = "x".join(map(str, plan.factors))
    if device.type != "cuda":
        return Backend("portable", f"PyTorch Monarch {factors}, {precision} operands",
                       f"{device.type} tensors run the portable PyTorch path")
    why_not = _kernel_unavailable(dtype, precision, plan)
    if why_not is None:
        if precision == "fp32":
            return Backend("cuda-fp32", f"fused fp32 radix FFT conv, N={plan.fft_size}",
                           "fp32-accurate fused kernel covers this call")
        return Backend("cuda-tensor-core", f"fused Monarch {factors} on tensor cores, {precision} operands",
                       "fused tensor-core kernel covers this call")
    # cuFFT covers the rest on GPUs, for every precision: it is faster than emulating the
    # operand rounding with unfused matmuls, and at least as accurate as asked for.
    kind = "fp32" if precision == "fp32" else "tensor-core"
    return Backend("torch.fft", f"cuFFT rfft/irfft in fp32, N={plan.fft_size}", f"no {kind} kernel: {why_not}")


def _kernel_unavailable(dtype: torch.dtype, precision: str, plan: MonarchPlan) -> str | None:
    if dtype not in IO_TYPE_CODES:
        return f"{dtype} input"
    if len(plan.factors) != 2:
        return f"N={plan.fft_size} needs {len(plan.factors)} factors; the kernels cover N <= 16384"
    if (reason := _extension.loaded_reason()) is not None:
        return reason
    n1, n2 = plan.factors
    code = (plan.fft_size, n1, n2, PRECISION_CODES[precision], IO_TYPE_CODES[dtype], plan.seq_len)
    if not torch.ops.monarch_fftconv_cuda.supports(*code):
        return f"the kernel does not cover N={plan.fft_size} ({precision}, {dtype})"
    return None


def _spectrum_shape(k: Tensor, seq_len: int) -> tuple[int, ...]:
    return (k.shape[0], *plan_for(seq_len).spectrum_shape, 2)


# --------------------------------------------------------------------------- filter_spectrum


@torch.library.custom_op("monarch_fftconv::filter_spectrum", mutates_args=())
def filter_spectrum(k: Tensor, seq_len: int, precision: str) -> Tensor:
    plan = plan_for(seq_len)
    if k.device.type == "cuda":
        # cuFFT in fp32 for every precision: one FFT and one gather instead of the emulated
        # engine's dozens of launches, at least as accurate, and immune to allow_tf32.
        spectrum = fft_fallback.filter_spectrum(k, plan)
    else:
        spectrum = portable.filter_spectrum(k, plan, precision)
    return torch.view_as_real(spectrum).contiguous()


@filter_spectrum.register_fake
def _(k: Tensor, seq_len: int, precision: str) -> Tensor:
    return k.new_empty(_spectrum_shape(k, seq_len), dtype=compute_dtype(k))


# --------------------------------------------------------------------------- conv_forward


@torch.library.custom_op("monarch_fftconv::conv_forward", mutates_args=())
def conv_forward(u: Tensor, filter_spectrum: Tensor, skip: Tensor | None, precision: str) -> Tensor:
    plan = plan_for(u.shape[-1])
    backend = select_backend(u.device, u.dtype, precision, plan)
    if backend.name.startswith("cuda"):
        n1, n2 = plan.factors
        if u.stride(-1) != 1:
            u = u.contiguous()
        return torch.ops.monarch_fftconv_cuda.conv_forward(
            u, filter_spectrum.float().contiguous(), None if skip is None else skip.float().contiguous(),
            plan.fft_size, n1, n2, PRECISION_CODES[precision],
        )
    spectrum = torch.view_as_complex(filter_spectrum.contiguous())
    if backend.name == "torch.fft":
        return fft_fallback.conv_forward(u, spectrum, skip, plan)
    return portable.conv_forward(u, spectrum, skip, plan, precision)


@conv_forward.register_fake
def _(u: Tensor, filter_spectrum: Tensor, skip: Tensor | None, precision: str) -> Tensor:
    return torch.empty_like(u, memory_format=torch.contiguous_format)


# --------------------------------------------------------------------------- fftconv + autograd


@torch.library.custom_op("monarch_fftconv::fftconv", mutates_args=())
def fftconv(u: Tensor, k: Tensor, skip: Tensor | None, precision: str) -> Tensor:
    return conv_forward(u, filter_spectrum(k, u.shape[-1], precision), skip, precision)


@fftconv.register_fake
def _(u: Tensor, k: Tensor, skip: Tensor | None, precision: str) -> Tensor:
    return torch.empty_like(u, memory_format=torch.contiguous_format)


@torch.library.custom_op("monarch_fftconv::fftconv_backward", mutates_args=())
def fftconv_backward(
    grad: Tensor, u: Tensor, k: Tensor, skip: Tensor | None, precision: str
) -> tuple[Tensor, Tensor, Tensor]:
    """(du, dk, dskip); dskip is empty when skip is None."""
    plan = plan_for(u.shape[-1])
    grad = grad.to(u.dtype).contiguous()
    backend = select_backend(u.device, u.dtype, precision, plan)
    if backend.name == "portable":
        spectrum = portable.filter_spectrum(k, plan, precision)
        du, dk, dskip = portable.conv_backward(grad, u, spectrum, skip, k.shape[-1], plan, precision)
    else:
        # du = correlation with k = convolution with the conjugate spectrum: the forward kernel
        # (or cuFFT) does it, and adds skip·grad for the skip term. dk sums over the batch.
        spectrum = filter_spectrum(k, u.shape[-1], precision)
        spectrum_conj = torch.view_as_real(torch.view_as_complex(spectrum).conj_physical())
        du = conv_forward(grad, spectrum_conj, skip, precision)
        dk = fft_fallback.filter_grad(grad, u, k.shape[-1], plan)
        dskip = None if skip is None else (grad.to(skip.dtype) * u.to(skip.dtype)).sum(dim=(0, 2))
    if dskip is None:
        dskip = u.new_empty(0, dtype=compute_dtype(u))
    return du.to(u.dtype), dk.to(k.dtype), dskip if skip is None else dskip.to(skip.dtype)


@fftconv_backward.register_fake
def _(grad: Tensor, u: Tensor, k: Tensor, skip: Tensor | None, precision: str) -> tuple[Tensor, Tensor, Tensor]:
    dskip = u.new_empty(0, dtype=compute_dtype(u)) if skip is None else torch.empty_like(skip)
    return torch.empty_like(u, memory_format=torch.contiguous_format), torch.empty_like(k), dskip


def _setup_context(ctx, inputs, output) -> None:
    u, k, skip, precision = inputs
    ctx.save_for_backward(u, k, skip)
    ctx.precision = precision


def _backward(ctx, grad: Tensor):
    u, k, skip = ctx.saved_tensors
    du, dk, dskip = fftconv_backward(grad, u, k, skip, ctx.precision)
    needs_u, needs_k, needs_skip, _ = ctx.needs_input_grad
    return (du if needs_u else None, dk if needs_k else None, dskip if needs_skip else None, None)


torch.library.register_autograd("monarch_fftconv::fftconv", _backward, setup_context=_setup_context)
