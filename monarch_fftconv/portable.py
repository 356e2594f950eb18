"""Portable Monarch FFT convolution in plain PyTorch: the executable spec of the kernels.

Every matmul rounds its operands to the chosen precision and accumulates in the compute
dtype (float32, or float64 for float64 inputs), as the tensor cores do. Pointwise work
(twiddles, the filter product) stays in the compute dtype. The CUDA kernels apply the
same rounding at the same points, so this module predicts their error.

Spectra are complex tensors of shape (..., R, M) in the plan's Monarch order (see
`planner.py`); the filter spectrum carries the inverse transform's 1/N.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .planner import MonarchPlan, MonarchTables, RowDFTTables, compute_dtype, tables_for

# --------------------------------------------------------------------------- rounding

_TF32_DROPPED_BITS = 13  # float32 keeps 23 mantissa bits, tf32 10


def _round_tf32(x: torch.Tensor) -> torch.Tensor:
    """Round to nearest (ties away from zero) onto the tf32 grid, like cvt.rna.tf32.f32."""
    bits = x.to(torch.float32).contiguous().view(torch.int32)
    half = 1 << (_TF32_DROPPED_BITS - 1)
    mask = -(1 << _TF32_DROPPED_BITS)
    return ((bits + half) & mask).view(torch.float32).to(x.dtype)


def round_operand(x: torch.Tensor, precision: str) -> torch.Tensor:
    """Round a real tensor to the matmul operand precision, keeping its dtype."""
    if precision == "fp32":
        return x
    if precision == "tf32":
        return _round_tf32(x)
    low = torch.bfloat16 if precision == "bf16" else torch.float16
    return x.to(low).to(x.dtype)


def _round_complex(z: torch.Tensor, precision: str) -> torch.Tensor:
    if precision == "fp32":
        return z
    return torch.complex(round_operand(z.real, precision), round_operand(z.imag, precision))


def _cmatmul(a: torch.Tensor, b: torch.Tensor, precision: str) -> torch.Tensor:
    return torch.matmul(_round_complex(a, precision), _round_complex(b, precision))


def _own_rounding(transform):
    """The engine rounds its matmul operands itself: an enclosing autocast region must not
    round them again (nor hand torch.complex bf16 halves)."""

    @functools.wraps(transform)
    def wrapper(x: torch.Tensor, *args, **kwargs):
        with torch.autocast(x.device.type, enabled=False):
            return transform(x, *args, **kwargs)

    return wrapper


def _tables(plan: MonarchPlan, dtype: torch.dtype, device: torch.device) -> MonarchTables:
    return tables_for(plan.fft_size, plan.factors, dtype, device)


# --------------------------------------------------------------------------- row DFTs


def _row_dft(a: torch.Tensor, t: RowDFTTables, precision: str) -> torch.Tensor:
    """DFT along the last dim (natural order in, Monarch order out)."""
    if t.sub is None:
        return _cmatmul(a, t.dft, precision)  # F is symmetric: a @ F = (F @ a^T)^T
    n = t.dft.shape[0]
    a = a.unflatten(-1, (n, t.size // n))  # [j, q]: element m·j + q
    a = _cmatmul(t.dft, a, precision) * t.twiddle  # DFT over j, then twiddle exp(-2πi·p·q/size)
    return _row_dft(a, t.sub, precision).flatten(-2)


def _row_idft(s: torch.Tensor, t: RowDFTTables, precision: str) -> torch.Tensor:
    """Unnormalised inverse of `_row_dft` (Monarch order in, natural order out)."""
    if t.sub is None:
        return _cmatmul(s, t.dft.conj_physical(), precision)
    n = t.dft.shape[0]
    s = _row_idft(s.unflatten(-1, (n, t.size // n)), t.sub, precision) * t.twiddle.conj_physical()
    return _cmatmul(t.dft.conj_physical(), s, precision).flatten(-2)


# --------------------------------------------------------------------------- transforms


@_own_rounding
def forward_spectrum(x: torch.Tensor, plan: MonarchPlan, precision: str) -> torch.Tensor:
    """Half spectrum (..., R, M) of the real sequence x (..., L') zero-padded to N, L' <= L."""
    dtype = compute_dtype(x)
    t = _tables(plan, dtype, x.device)
    live, m = plan.live_rows, plan.row_size
    # Only the first `live` rows of the padded input hold data: stage 1 contracts over those.
    rows = F.pad(x.to(dtype), (0, live * m - x.shape[-1])).unflatten(-1, (live, m))
    rows = round_operand(rows, precision)
    stage1 = t.stage1[:, :live]
    a = torch.complex(
        torch.matmul(round_operand(stage1.real, precision), rows),
        torch.matmul(round_operand(stage1.imag, precision), rows),
    )
    a = a * t.twiddle
    return _row_dft(a, t.rows, precision)


@_own_rounding
def inverse_spectrum(spectrum: torch.Tensor, plan: MonarchPlan, precision: str, out_len: int) -> torch.Tensor:
    """First `out_len` samples (out_len <= N) of the real sequence whose half spectrum (scaled by
    1/N) is given."""
    t = _tables(plan, spectrum.real.dtype, spectrum.device)
    a = _row_idft(spectrum, t.rows, precision) * t.twiddle.conj_physical()
    a_re, a_im = round_operand(a.real, precision), round_operand(a.imag, precision)
    half = plan.fft_size // 2
    live = -(-min(out_len, half) // plan.row_size)  # only the output rows that are kept
    cos = round_operand(t.inverse_cos[:live], precision)
    sin = round_operand(t.inverse_sin[:live], precision)
    y = (torch.matmul(cos, a_re) - torch.matmul(sin, a_im)).flatten(-2)
    if out_len > half:
        # The circle's back half (a filter gradient's negative lags): output row r + n1/2 is row
        # r's with (-1)^k1 on spectrum row k1, as cos(2π(r + n1/2)k1/n1) = (-1)^k1 cos(2π r k1/n1).
        sign = 1 - 2 * (torch.arange(cos.shape[-1], device=cos.device) % 2).to(cos.dtype)
        y = torch.cat([y, (torch.matmul(cos * sign, a_re) - torch.matmul(sin * sign, a_im)).flatten(-2)], dim=-1)
    return y[..., :out_len].contiguous()


def filter_spectrum(k: torch.Tensor, plan: MonarchPlan, precision: str) -> torch.Tensor:
    """Filter spectrum (C, R, M) complex, with the inverse's 1/N folded in."""
    return forward_spectrum(k, plan, precision) / plan.fft_size


# --------------------------------------------------------------------------- convolution


def conv_forward(
    u: torch.Tensor, spectrum: torch.Tensor, skip: torch.Tensor | None, plan: MonarchPlan, precision: str
) -> torch.Tensor:
    """y = causal_conv(u, k) (+ skip·u), with k given by its spectrum; result in u's dtype."""
    length = u.shape[-1]
    y = inverse_spectrum(forward_spectrum(u, plan, precision) * spectrum, plan, precision, length)
    if skip is not None:
        y = y + skip.to(y.dtype).unsqueeze(-1) * u.to(y.dtype)
    return y.to(u.dtype)


def conv_backward(
    grad: torch.Tensor,
    u: torch.Tensor,
    spectrum: torch.Tensor,
    skip: torch.Tensor | None,
    filter_len: int,
    plan: MonarchPlan,
    precision: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients of `conv_forward` as FFT correlations through the same engine.

    du[s] = Σ_t g[t]·k[t-s]  -> spectrum G·conj(K)
    dk[j] = Σ_b Σ_t g[t]·u[t-j] -> spectrum Σ_b G·conj(U) / N
    """
    length = u.shape[-1]
    g_spec = forward_spectrum(grad, plan, precision)
    du = inverse_spectrum(g_spec * spectrum.conj_physical(), plan, precision, length)
    u_spec = forward_spectrum(u, plan, precision)
    dk_spec = (g_spec * u_spec.conj_physical()).sum(0) / plan.fft_size
    dk = inverse_spectrum(dk_spec, plan, precision, filter_len)
    d_skip = None
    if skip is not None:
        g, uu = grad.to(du.dtype), u.to(du.dtype)
        du = du + skip.to(du.dtype).unsqueeze(-1) * g
        d_skip = (g * uu).sum(dim=(0, 2))
    return du, dk, d_skip
