"""Monarch planner: factorisation of the FFT size, index orders, and the DFT/twiddle tables.

Everything here is pure bookkeeping: no convolution is computed. The portable engine
(`portable.py`) and the CUDA kernels (`csrc/`) both follow the plan described here;
`docs/design.md` derives it.

Conventions (N = n1·M, M = prod(factors[1:])):
- time index      t = M·r + s          (r < n1 rows, s < M columns: the row-major sequence)
- frequency index f = k1 + n1·g(pos)   (k1 = row of the spectrum, pos = column position)
  where g is the digit-reversal of the row DFT (identity when there are two factors).
- Only the Hermitian half of the rows, k1 = 0 .. n1/2, is ever stored.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

MAX_FACTOR = 128  # largest DFT done as one dense matmul (one tensor-core tile family)
MIN_FFT_SIZE = 4  # two factors of at least 2 each


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The real dtype of tables, spectra and accumulation: float64 if any input is float64
    (gradcheck, references), float32 otherwise (bf16/fp16 inputs compute in float32)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def real_fft_flops(n: int) -> float:
    """The flop convention for FFTs (package and benchmark): a complex FFT of n points costs
    5·n·log2(n), a real-input FFT (or a Hermitian-output inverse) half of that."""
    return 2.5 * n * math.log2(n) if n > 1 else 0.0


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def factorize(fft_size: int) -> tuple[int, ...]:
    """Split a power of two into the fewest factors <= MAX_FACTOR, as even as possible,
    largest first (16384 -> (128, 128), 8192 -> (128, 64), 32768 -> (32, 32, 32))."""
    if fft_size < MIN_FFT_SIZE or fft_size & (fft_size - 1):
        raise ValueError(f"fft_size must be a power of two >= {MIN_FFT_SIZE}, got {fft_size}")
    log_n = fft_size.bit_length() - 1
    max_log = MAX_FACTOR.bit_length() - 1
    count = max(2, math.ceil(log_n / max_log))
    base, extra = divmod(log_n, count)
    return tuple(1 << (base + (1 if i < extra else 0)) for i in range(count))


@dataclass(frozen=True)
class MonarchPlan:
    """How a causal convolution of length `seq_len` is computed."""

    seq_len: int  # L: number of outputs (and maximal filter length)
    fft_size: int  # N = 2·next_pow2(L): linear convolution without wrap-around
    factors: tuple[int, ...]  # N = prod(factors); factors[0] is the stage-1 (column) DFT

    @property
    def n1(self) -> int:
        return self.factors[0]

    @property
    def row_size(self) -> int:
        """M: length of each row (the stage-2 DFT size; n2 when there are two factors)."""
        return self.fft_size // self.n1

    @property
    def half_rows(self) -> int:
        """R = n1/2 + 1: rows of the Hermitian half spectrum that are stored."""
        return self.n1 // 2 + 1

    @property
    def live_rows(self) -> int:
        """Rows of the padded input that hold data, and rows of output that are kept."""
        return -(-self.seq_len // self.row_size)

    @property
    def spectrum_shape(self) -> tuple[int, int]:
        return (self.half_rows, self.row_size)

    def flops_per_sequence(self) -> int:
        """Real flops of the dense Monarch algorithm as the portable path runs it, for one
        sequence, forward transform + pointwise product + inverse (one FMA = 2 flops)."""
        r, m, live = self.half_rows, self.row_size, self.live_rows
        stage1 = 2 * 2 * r * live * m  # real data times complex F1
        inverse1 = 2 * 2 * live * r * m  # real output from complex A'
        rows = 2 * _row_dft_flops(self.factors[1:]) * r  # forward + inverse row DFTs
        pointwise = 6 * r * m
        twiddles = 2 * 6 * r * m
        return stage1 + inverse1 + rows + pointwise + twiddles

    def tensor_core_flops_per_sequence(self, tile_rows: int = 16) -> int:
        """Real MMA flops the fused tensor-core kernel issues per sequence (two factors):
        the R rows padded to whole m16 tiles, stage 2 and its inverse over half the columns
        (conjugate-column symmetry: four real products each), K padded to the MMA depth."""
        n1, n2 = self.factors
        rows = -(-self.half_rows // tile_rows) * tile_rows
        live = self.live_rows
        stage1 = 2 * 2 * rows * live * n2
        stage2 = 4 * 2 * rows * n2 * (n2 // 2)
        inverse1 = 2 * 2 * live * rows * n2
        return stage1 + 2 * stage2 + inverse1


def _row_dft_flops(factors: tuple[int, ...]) -> int:
    """Real flops of one complex row DFT of length prod(factors), dense per factor."""
    size = math.prod(factors)
    return sum(8 * size * f for f in factors) + 6 * size * (len(factors) - 1)


_PLANS: dict[int, MonarchPlan] = {}


def plan_for(seq_len: int) -> MonarchPlan:
    """The plan of a length: memoised by eager calls. Not an lru_cache, which Dynamo traces
    through with a warning on every compile; a traced call builds the plan (a constant)."""
    if (plan := _PLANS.get(seq_len)) is not None:
        return plan
    if seq_len < 1:
        raise ValueError(f"sequence length must be >= 1, got {seq_len}")
    fft_size = max(MIN_FFT_SIZE, 2 * next_pow2(seq_len))
    plan = MonarchPlan(seq_len, fft_size, factorize(fft_size))
    if not torch.compiler.is_compiling():
        _PLANS[seq_len] = plan
    return plan


@functools.lru_cache(maxsize=None)
def row_frequency_order(factors: tuple[int, ...]) -> tuple[int, ...]:
    """g: column position -> frequency digit of the row DFT over prod(factors) points.

    One factor: natural order. More: position p·m + q holds frequency p + n·g_sub(q)."""
    if len(factors) == 1:
        return tuple(range(factors[0]))
    n, sub = factors[0], row_frequency_order(factors[1:])
    return tuple(p + n * q for p in range(n) for q in sub)


def spectrum_frequencies(plan: MonarchPlan) -> torch.Tensor:
    """(R, M) int64 tensor: the frequency f that each stored spectrum entry holds."""
    rows = torch.arange(plan.half_rows).unsqueeze(1)
    cols = torch.tensor(row_frequency_order(plan.factors[1:])).unsqueeze(0)
    return rows + plan.n1 * cols


# --------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class RowDFTTables:
    """Tables of one level of the (possibly recursive) row DFT of length `size`."""

    size: int
    dft: torch.Tensor  # (n, n) complex, F_n[j, p] = exp(-2πi·j·p/n)
    twiddle: torch.Tensor | None  # (n, size/n) complex, exp(-2πi·p·q/size); None at the last level
    sub: RowDFTTables | None


@dataclass(frozen=True)
class MonarchTables:
    """All constants of one plan, in one dtype on one device (complex in `dtype`'s complex type)."""

    stage1: torch.Tensor  # (R, n1/2) complex: F_n1[k1, r] for the non-zero input rows r < n1/2
    twiddle: torch.Tensor  # (R, M) complex: exp(-2πi·k1·s/N)
    rows: RowDFTTables
    inverse_cos: torch.Tensor  # (n1/2, R) real: w[k1]·cos(2π·r·k1/n1)
    inverse_sin: torch.Tensor  # (n1/2, R) real: w[k1]·sin(2π·r·k1/n1)


def _dft(n: int) -> torch.Tensor:
    # Reduce j·p mod n exactly in integers before the angle: keeps float64 tables exact to ~1 ulp.
    prod = torch.outer(torch.arange(n), torch.arange(n)) % n
    return torch.polar(torch.ones(n, n, dtype=torch.float64), -2 * math.pi * prod.double() / n)


def _twiddle(rows: int, cols: int, size: int) -> torch.Tensor:
    prod = torch.outer(torch.arange(rows), torch.arange(cols)) % size
    return torch.polar(torch.ones(rows, cols, dtype=torch.float64), -2 * math.pi * prod.double() / size)


def _row_tables(factors: tuple[int, ...]) -> RowDFTTables:
    size = math.prod(factors)
    if len(factors) == 1:
        return RowDFTTables(size, _dft(size), None, None)
    n = factors[0]
    return RowDFTTables(size, _dft(n), _twiddle(n, size // n, size), _row_tables(factors[1:]))


def _map_row_tables(t: RowDFTTables, fn) -> RowDFTTables:
    return RowDFTTables(
        t.size,
        fn(t.dft),
        None if t.twiddle is None else fn(t.twiddle),
        None if t.sub is None else _map_row_tables(t.sub, fn),
    )


def built_as_normal_tensors(build):
    """A cached table builder whose tensors are normal ones whichever mode first asks for them:
    built under torch.inference_mode() they would be inference tensors, which a later call that
    autograd records cannot save for backward."""

    @functools.wraps(build)
    def wrapper(*args):
        with torch.inference_mode(False):
            return build(*args)

    return wrapper


@functools.lru_cache(maxsize=None)  # built inside tables_for alone, whose wrapper sets the mode
def _tables_float64(plan_key: tuple[int, tuple[int, ...]]) -> MonarchTables:
    fft_size, factors = plan_key
    n1 = factors[0]
    half, r_rows, m = n1 // 2, n1 // 2 + 1, fft_size // n1
    full = _dft(n1)
    stage1 = full[:r_rows, :half]
    weight = torch.full((r_rows,), 2.0, dtype=torch.float64)
    weight[0] = weight[-1] = 1.0  # rows 0 and n1/2 are their own Hermitian partners
    inverse = full[:half, :r_rows].conj_physical() * weight  # exp(+2πi·r·k1/n1)·w[k1]
    return MonarchTables(
        stage1=stage1,
        twiddle=_twiddle(r_rows, m, fft_size),
        rows=_row_tables(factors[1:]),
        inverse_cos=inverse.real.contiguous(),
        inverse_sin=inverse.imag.contiguous(),
    )


@functools.lru_cache(maxsize=64)
@built_as_normal_tensors
def tables_for(fft_size: int, factors: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> MonarchTables:
    """The plan's tables in real dtype `dtype` (float32 or float64) on `device`, built once
    in float64 on the host and cached per (N, dtype, device)."""
    complex_dtype = torch.complex128 if dtype == torch.float64 else torch.complex64
    base = _tables_float64((fft_size, factors))

    def cplx(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=complex_dtype)

    def real(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype)

    return MonarchTables(
        stage1=cplx(base.stage1),
        twiddle=cplx(base.twiddle),
        rows=_map_row_tables(base.rows, cplx),
        inverse_cos=real(base.inverse_cos),
        inverse_sin=real(base.inverse_sin),
    )
