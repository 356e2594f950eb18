"""The next Hopper tensor-core engine (docs/design.md, "The next tensor-core engine"), in
float64 on the CPU, as the kernel will run it.

`Engine` issues the GEMMs in the order and the shapes the two consumer warpgroups issue them
(wgmma m64nNk16: M = 64 rows, K in steps of 16; A from registers or shared memory, B from
shared memory), with the fp32 epilogues between them, so CI checks the engine's algebra
before any CUDA exists:
- a job is `pairs_per_job` pairs of one channel, each pair two batch entries packed as one
  complex sequence z = u_a + i·u_b; its spectrum has 128 rows: rows 0..63 are warpgroup 0's
  tile, rows 64..127 warpgroup 1's (at n1 = 128 the low and high frequency rows of one pair,
  at smaller n1 whole pairs, with block-diagonal stage-1 and inverse-1 tables);
- the filter spectrum is the channel's half rows (today's contract), resident in the
  operand type with a per-channel power-of-two scale; the other rows are read mirrored;
- a pair whose outputs are not all finite is computed again, one sequence at a time;
- the backward accumulates conj(Z_u)·Z_dy of the packed spectra and takes the real part of
  one inverse per channel.
With `precision` set, every GEMM operand (and the resident filter, and the backward's parked
spectrum) is rounded to bf16 or fp16; accumulation stays exact, as fp32's error is far below
what that measures. So the same code predicts the engine's error."""

import math
from dataclasses import dataclass

import pytest
import torch

from monarch_fftconv.planner import plan_for, spectrum_frequencies
from monarch_fftconv.portable import round_operand

from helpers import BUDGETS, randn, reference, rel_l2

TILE_M = 64  # wgmma's M: the rows of one warpgroup's accumulator
K_STEP = 16  # wgmma's K for 16-bit operands
JOB_ROWS = 2 * TILE_M  # spectrum rows of one job: a tile per consumer warpgroup
WARPGROUPS = (0, 1)


@dataclass(frozen=True)
class Mma:
    """One GEMM of a warpgroup: C (M × N) += A (M × K) · B (K × N), issued as K/16 wgmma."""

    stage: str
    warpgroup: int
    m: int
    n: int
    k: int
    a_from: str  # "registers" (the previous stage's accumulator) or "smem" (a table)
    b_from: str  # "ring" (the producer's tiles), "tables", or "hand-off" (the consumers' stores)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


def _angles(rows: int, cols: int, size: int) -> torch.Tensor:
    # j·p reduced mod size in integers first: the tables stay exact to an ulp
    return 2 * math.pi * (torch.outer(torch.arange(rows), torch.arange(cols)) % size).double() / size


# engine_traits.cuh's kHandoffExponent: the share of 2^-e that the 16-bit hand-off takes (the
# rest is undone on y, in fp32).
HANDOFF_EXPONENT = 13
# The exponents an fp32 spectrum gives: its peak lies in [2^-149, 2^128).
FP32_EXPONENTS = range(-127, 150)


# Where the scaled filter's peak lies: [2^-p, 2^(1-p)): engine_traits.cuh's kFilterPeakExponent,
# the default of MONARCH_FFTCONV_ENGINE_FILTER_PEAK_EXPONENT (filter_exponent's e = 1 - x - p), 7 since
# session 30 (docs/design.md, "fp16's range"). With p = 0, the old default, the filtered spectrum
# is rounded to fp16 at the input spectrum's own size and overflows on inputs of mean 4-8
# (L = 8192); with 7 fp16 reaches the mma.sync kernel's ceiling. The tests below measure both.
FILTER_PEAK_EXPONENT = 7


def _scale_exponent(z: torch.Tensor) -> int:
    """e such that the largest component of z·2^e lies in [2^-p, 2^(1-p)), p =
    FILTER_PEAK_EXPONENT; 0 for a zero or non-finite z. Exact. From an fp32 spectrum (p = 0) e
    lies in [-127, 149]: 2^e itself overflows fp32 from e = 128, so the kernel scales each
    component (ldexpf) and never forms it."""
    peak = torch.maximum(z.real.abs().max(), z.imag.abs().max()).item()
    return 0 if not math.isfinite(peak) or peak == 0 else -math.floor(math.log2(peak)) - FILTER_PEAK_EXPONENT


def _unscales(e: int) -> tuple[float, float]:
    """2^-e split between the hand-off's twiddle and y: the hand-off takes 2^-min(e, 13), so the
    16-bit values of a tiny channel are those of a filter peaking at 2^-(13+p) (2^-13 at p = 0:
    the benchmark's, randn/sqrt(L)), not underflowed; y takes the rest. Both factors are fp32 powers of two for
    every e an fp32 spectrum gives: at most 2^127, at least 2^-136."""
    assert e + FILTER_PEAK_EXPONENT in FP32_EXPONENTS, e
    to_handoff = max(min(e, HANDOFF_EXPONENT), -127)  # e reaches -127 - p: 2^-to_handoff stays finite
    return 2.0**-to_handoff, 2.0**(to_handoff - e)


def _conjugate_columns(pc, qs, qc, ps, sign: int, n: int) -> torch.Tensor:
    """Columns j and n − j of (P + iQ)·(C + sign·iS) from four real half-width products
    pc = P·C, qs = Q·S, qc = Q·C, ps = P·S (C, S: n × n/2). S's column 0 (sines of
    frequency 0, all zero) carries column n/2's cosines, the other real column."""
    out = torch.empty(pc.shape[0], n, dtype=torch.complex128)
    j = torch.arange(1, n // 2)
    out[:, j] = torch.complex(pc[:, j] - sign * qs[:, j], qc[:, j] + sign * ps[:, j])
    out[:, n - j] = torch.complex(pc[:, j] + sign * qs[:, j], qc[:, j] - sign * ps[:, j])
    out[:, 0] = torch.complex(pc[:, 0], qc[:, 0])
    out[:, n // 2] = torch.complex(ps[:, 0], qs[:, 0])
    return out


def mirror(x: torch.Tensor, n1: int, n2: int) -> torch.Tensor:
    """x at frequency N − f, for x (n1, n2) in the Monarch layout f = k1 + n1·k2: position
    (n1 − k1, n2 − 1 − k2) for k1 ≥ 1, (0, −k2 mod n2) for k1 = 0."""
    k1 = torch.arange(n1).unsqueeze(1)
    k2 = torch.arange(n2).unsqueeze(0)
    src_k2 = torch.where(k1 == 0, (-k2) % n2, n2 - 1 - k2)
    return x[(-k1) % n1, src_k2]


class Engine:
    def __init__(self, length: int, precision: str | None = None):
        plan = plan_for(length)
        assert len(plan.factors) == 2 and plan.n1 <= JOB_ROWS, "the engine covers N = 256 .. 16384"
        self.plan, self.length, self.precision = plan, length, precision
        self.n1, self.n2 = n1, n2 = plan.factors
        self.fft_size = plan.fft_size
        self.pairs_per_job = JOB_ROWS // n1
        self.half = n1 // 2  # rows of a pair in the ring tile (input) and in the output
        self.trace: list[Mma] = []
        angle1 = _angles(n1, n1, n1)
        self.c1, self.s1 = torch.cos(angle1), torch.sin(angle1)  # F1 = c1 − i·s1, symmetric
        angle2 = _angles(n2, n2 // 2, n2)
        self.c2, self.s2 = torch.cos(angle2), torch.sin(angle2)  # half the columns of F2
        self.s2[:, 0] = (-1.0) ** torch.arange(n2).double()  # column n2/2 in the zero sines' slot
        rows = torch.arange(JOB_ROWS)
        self.row_pair, self.row_k1 = rows // n1, rows % n1  # job row -> (pair, frequency row)
        self.twiddle = torch.polar(torch.ones(n1, n2, dtype=torch.float64), -_angles(n1, n2, self.fft_size))[self.row_k1]

    # ---------------------------------------------------------------- operands and GEMMs

    def op(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.precision is None else round_operand(x, self.precision)

    def op_complex(self, z: torch.Tensor) -> torch.Tensor:
        return z if self.precision is None else torch.complex(self.op(z.real), self.op(z.imag))

    def mma(self, stage: str, wg: int, a: torch.Tensor, b: torch.Tensor, a_from: str, b_from: str) -> torch.Tensor:
        (m, k), (k_b, n) = a.shape, b.shape
        assert m == TILE_M and k == k_b and k % K_STEP == 0 and n % 8 == 0 and 8 <= n <= 256, (stage, a.shape, b.shape)
        self.trace.append(Mma(stage, wg, m, n, k, a_from, b_from))
        return self.op(a) @ self.op(b)

    @staticmethod
    def tile(wg: int) -> slice:
        return slice(wg * TILE_M, (wg + 1) * TILE_M)

    @property
    def stage1_depth(self) -> int:
        """K of stage 1: the live input rows of the one pair (n1 = 128, zeros past L by TMA's
        fill) rounded up to k16, or the n1/2 rows of each of the tile's pairs (n1 ≤ 64)."""
        if self.pairs_per_job == 1:
            live = -(-self.length // self.n2)
            return -(-live // K_STEP) * K_STEP
        return TILE_M // 2

    # ---------------------------------------------------------------- the stages

    def ring_tile(self, seqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The producer's stage: (2·pairs, L) sequences -> Zr, Zi (64 rows, n2): row q holds
        row q mod n1/2 of pair q div n1/2; sequence 2p is pair p's real part, 2p + 1 its imaginary."""
        x = torch.zeros(len(seqs), self.half * self.n2, dtype=torch.float64)
        x[:, : self.length] = seqs
        x = x.view(self.pairs_per_job, 2, self.half * self.n2)
        return x[:, 0].reshape(TILE_M, self.n2), x[:, 1].reshape(TILE_M, self.n2)

    def stage1(self, wg: int, zr: torch.Tensor, zi: torch.Tensor) -> torch.Tensor:
        """A = F1 · Z for the tile's rows, then the twiddle: two accumulators (Re, Im), each
        the sum of two SS GEMMs: the F1 table's rows (A) times the ring tile (B)."""
        rows = self.tile(wg)
        q = torch.arange(self.stage1_depth) + (0 if self.pairs_per_job == 1 else wg * self.stage1_depth)
        same_pair = self.row_pair[rows].unsqueeze(1) == (q // self.half).unsqueeze(0)  # block-diagonal
        c = self.c1[self.row_k1[rows]][:, q % self.half] * same_pair
        s = self.s1[self.row_k1[rows]][:, q % self.half] * same_pair
        mma = lambda a, b: self.mma("stage 1", wg, a, b, "smem", "ring")  # noqa: E731
        re = mma(c, zr[q]) + mma(s, zi[q])  # F1·Z = (c − is)(zr + i·zi)
        im = mma(c, zi[q]) - mma(s, zr[q])
        return torch.complex(re, im) * self.twiddle[rows]  # fp32 epilogue; rounded as stage 2's A

    def stage2(self, wg: int, a: torch.Tensor) -> torch.Tensor:
        """X = A · F2 along the rows: A from registers (stage 1's accumulator), the half-column
        F2 tables from shared memory, four products; columns j and n2 − j from each."""
        mma = lambda x, t: self.mma("stage 2", wg, x, t, "registers", "tables")  # noqa: E731
        pc, qs, qc, ps = mma(a.real, self.c2), mma(a.imag, self.s2), mma(a.imag, self.c2), mma(a.real, self.s2)
        return _conjugate_columns(pc, qs, qc, ps, -1, self.n2)

    def inverse2(self, wg: int, p: torch.Tensor) -> torch.Tensor:
        """A' = P · conj(F2): P from registers (the filtered spectrum), the same F2 tables."""
        mma = lambda x, t: self.mma("inverse 2", wg, x, t, "registers", "tables")  # noqa: E731
        pc, qs, qc, ps = mma(p.real, self.c2), mma(p.imag, self.s2), mma(p.imag, self.c2), mma(p.real, self.s2)
        return _conjugate_columns(pc, qs, qc, ps, +1, self.n2)

    def inverse1(self, wg: int, handoff: torch.Tensor) -> torch.Tensor:
        """y = conj(F1) · A' for the causal rows r < n1/2 of every pair, on the warpgroup's half
        of the columns: the F1 table read transposed (A, SS) times the hand-off (B)."""
        out = torch.arange(TILE_M)
        same_pair = (out // self.half).unsqueeze(1) == self.row_pair.unsqueeze(0)
        c = self.c1[self.row_k1][:, out % self.half].T * same_pair  # (r, k1): cos(2π·r·k1/n1)
        s = self.s1[self.row_k1][:, out % self.half].T * same_pair
        cols = slice(wg * self.n2 // 2, (wg + 1) * self.n2 // 2)
        br, bi = handoff.real[:, cols], handoff.imag[:, cols]
        mma = lambda a, b: self.mma("inverse 1", wg, a, b, "smem", "hand-off")  # noqa: E731
        return torch.complex(mma(c, br) - mma(s, bi), mma(c, bi) + mma(s, br))  # (c + is)(br + i·bi)

    # ---------------------------------------------------------------- a job

    def spectrum_job(self, seqs: torch.Tensor) -> torch.Tensor:
        """Stage 1 and stage 2 on both warpgroups: (2·pairs, L) -> the packed spectra (128, n2)."""
        zr, zi = self.ring_tile(seqs)
        return torch.cat([self.stage2(wg, self.stage1(wg, zr, zi)) for wg in WARPGROUPS])

    def inverse_job(self, p: torch.Tensor, unscales: tuple[float, float]) -> torch.Tensor:
        """Inverse 2, the conj twiddle (with the hand-off's share of the filter scale undone), the
        one hand-off through shared memory, inverse 1, y's share: (128, n2) -> (pairs, L) complex."""
        handoff = torch.cat([self.inverse2(wg, p[self.tile(wg)]) for wg in WARPGROUPS])
        handoff_unscale, output_unscale = unscales
        handoff = handoff * self.twiddle.conj() * handoff_unscale
        y = torch.cat([self.inverse1(wg, handoff) for wg in WARPGROUPS], dim=1)  # (pair·r, s)
        return y.reshape(self.pairs_per_job, self.half * self.n2)[:, : self.length] * output_unscale

    def conv_job(self, seqs: torch.Tensor, filt: "ResidentFilter") -> torch.Tensor:
        p = self.spectrum_job(seqs) * filt.rows(self.row_k1)  # fp32, rounded as inverse 2's A
        return self.inverse_job(p, filt.unscales)

    def jobs(self, seqs: torch.Tensor):
        """The batch walk: pairs (2b, 2b + 1) in order; an odd batch's last partner is zeros."""
        per_job = 2 * self.pairs_per_job
        padded = torch.cat([seqs.double(), seqs.new_zeros((-len(seqs)) % per_job, self.length).double()])
        return padded.split(per_job)

    def alone(self, seq: torch.Tensor, filt: "ResidentFilter") -> torch.Tensor:
        """One sequence as the real part of its own pair: what the NaN rule recomputes."""
        seqs = torch.zeros(2 * self.pairs_per_job, self.length, dtype=torch.float64)
        seqs[0] = seq
        return self.conv_job(seqs, filt)[0].real

    def unpack(self, seqs, packed: torch.Tensor, filt, isolate: bool) -> list[torch.Tensor]:
        """Pair p's outputs are Re and Im of its complex result. With `isolate` (the engine's
        rule), a pair with any non-finite output is computed again unpacked."""
        out = []
        for p, y in enumerate(packed):
            a, b = seqs[2 * p], seqs[2 * p + 1]
            if isolate and not torch.isfinite(y).all():
                y = torch.complex(self.alone(a, filt), self.alone(b, filt))
            out += [y.real, y.imag]
        return out

    # ---------------------------------------------------------------- the calls of one channel

    def forward(self, u: torch.Tensor, filt: "ResidentFilter", isolate: bool = True) -> torch.Tensor:
        out = []
        for seqs in self.jobs(u):
            out += self.unpack(seqs, self.conv_job(seqs, filt), filt, isolate)
        return torch.stack(out[: len(u)])

    def backward(self, u, dy, filt_conj: "ResidentFilter", filter_len: int, isolate: bool = True):
        """du = corr(dy, k): the forward's chain with conj(K) on packed dy pairs. dk: W = Σ
        conj(Z_u)·Z_dy over the walk (fp32, per frequency), then Re of one inverse; dD = dk[0]."""
        acc = torch.zeros(self.n1, self.n2, dtype=torch.complex128)
        du = []
        for u_seqs, dy_seqs in zip(self.jobs(u), self.jobs(dy)):
            z_u = self.op_complex(self.spectrum_job(u_seqs))  # parked in the hand-off buffer
            z_dy = self.spectrum_job(dy_seqs)
            acc += (z_u.conj() * z_dy).view(self.pairs_per_job, self.n1, self.n2).sum(0)
            packed = self.inverse_job(z_dy * filt_conj.rows(self.row_k1), filt_conj.unscales)
            du += self.unpack(dy_seqs, packed, filt_conj, isolate)
        dk = self.filter_gradient(acc)
        return torch.stack(du[: len(u)]), dk[:filter_len], dk[0]

    def filter_gradient(self, acc: torch.Tensor) -> torch.Tensor:
        """Re of the inverse of acc/N (scaled like the filter for the half type), pair 0 of a job."""
        w = acc / self.fft_size
        e = _scale_exponent(w)
        p = torch.zeros(JOB_ROWS, self.n2, dtype=torch.complex128)
        p[: self.n1] = w * 2.0**e
        return self.inverse_job(p, _unscales(e))[0].real


class ResidentFilter:
    """A channel's spectrum in shared memory: today's contract (the n1/2 + 1 half rows of
    FFT_N(k)/N in the Monarch layout, with the skip term folded in as + D/N), scaled by 2^e and
    rounded to the operand type. Rows k1 > n1/2 are read as conj of their mirror."""

    def __init__(self, engine: Engine, k: torch.Tensor, skip: float, conjugate: bool = False):
        n = engine.fft_size
        full = (torch.fft.fft(k.double(), n=n) + skip) / n
        half = full[spectrum_frequencies(engine.plan)]
        half = half.conj_physical() if conjugate else half
        e = _scale_exponent(half)
        self.half_rows, self.unscale, self.unscales = engine.op_complex(half * 2.0**e), 2.0**-e, _unscales(e)
        self.n1, self.n2 = engine.n1, engine.n2

    def rows(self, k1: torch.Tensor) -> torch.Tensor:
        half = self.n1 // 2
        k2 = torch.arange(self.n2)
        direct = self.half_rows[k1.clamp(max=half)]
        mirrored = self.half_rows[(self.n1 - k1).clamp(max=half)][:, self.n2 - 1 - k2].conj()
        return torch.where((k1 > half).unsqueeze(1), mirrored, direct)


# ==================================================================== tests

# (L, Lk): one L per FFT size 256 .. 16384, most not powers of two, several Lk < L
SIZES = [(128, 128), (200, 77), (300, 300), (1000, 999), (2000, 1500), (3001, 3001), (5001, 1234), (8192, 8192)]


def complex_rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """rel_l2 of complex tensors (rel_l2's .double() would drop the imaginary parts)."""
    return rel_l2(torch.view_as_real(out.resolve_conj()), torch.view_as_real(ref.resolve_conj()))


def channel_inputs(gen, batch, length, filter_len):
    return (randn(gen, batch, length, dtype=torch.float64), randn(gen, filter_len, dtype=torch.float64),
            randn(gen, 1, dtype=torch.float64).item())


@pytest.mark.parametrize("length, filter_len", SIZES)
def test_forward_is_the_convolution(length, filter_len, gen):
    """Two channels, an odd batch (the last pair's partner is zeros), against torch.fft."""
    engine = Engine(length)
    for _ in range(2):
        u, k, skip = channel_inputs(gen, 3, length, filter_len)
        y = engine.forward(u, ResidentFilter(engine, k, skip))
        assert rel_l2(y, reference(u, k.unsqueeze(0), torch.tensor([skip], dtype=torch.float64))) < 1e-12


@pytest.mark.parametrize("length", [length for length, _ in SIZES])
def test_gemms_are_wgmma_tiles_in_the_designed_roles(length, gen):
    """Every GEMM is m64 with K in k16 steps and a legal N; each stage takes its operands where
    docs/design.md says; both warpgroups issue the same GEMMs (uniform work); the MMA flops per
    sequence are the design's count."""
    engine = Engine(length)
    k = randn(gen, length, dtype=torch.float64)
    engine.forward(randn(gen, 2 * engine.pairs_per_job, length, dtype=torch.float64), ResidentFilter(engine, k, 0.0))
    roles = {(m.stage, m.a_from, m.b_from) for m in engine.trace}
    assert roles == {("stage 1", "smem", "ring"), ("stage 2", "registers", "tables"),
                     ("inverse 2", "registers", "tables"), ("inverse 1", "smem", "hand-off")}
    assert all(m.m == TILE_M and m.k % K_STEP == 0 and m.n % 8 == 0 for m in engine.trace)
    per_wg = [sorted((m.stage, m.n, m.k) for m in engine.trace if m.warpgroup == wg) for wg in WARPGROUPS]
    assert per_wg[0] == per_wg[1]
    n2, depth = engine.n2, engine.stage1_depth
    per_warpgroup = 4 * 2 * TILE_M * (n2 * depth + 2 * (n2 // 2) * n2 + (n2 // 2) * JOB_ROWS)
    per_sequence = sum(m.flops for m in engine.trace) / (2 * engine.pairs_per_job)
    assert per_sequence == 2 * per_warpgroup / (2 * engine.pairs_per_job)
    print(f"N={engine.fft_size} (n1, n2)=({engine.n1}, {n2}): {per_sequence / 1e6:.2f} MFLOP of MMA per sequence")


@pytest.mark.parametrize("length, filter_len", [(8192, 8192), (1000, 999), (128, 5)])
def test_resident_filter_reads_every_row_from_the_half_rows(length, filter_len, gen):
    """The n1/2 + 1 stored rows and the mirror rule give the whole n1 × n2 Monarch layout of
    FFT_N(k)/N (+ D/N) as torch.fft computes it, conjugated for the backward."""
    engine = Engine(length)
    k, skip = randn(gen, filter_len, dtype=torch.float64), randn(gen, 1, dtype=torch.float64).item()
    n1, n2, n = engine.n1, engine.n2, engine.fft_size
    frequency = torch.arange(n1).unsqueeze(1) + n1 * torch.arange(n2).unsqueeze(0)
    expected = ((torch.fft.fft(k, n=n) + skip) / n)[frequency]
    for conjugate in (False, True):
        filt = ResidentFilter(engine, k, skip, conjugate)
        got = filt.rows(torch.arange(n1)) * filt.unscale
        assert complex_rel_l2(got, expected.conj() if conjugate else expected) < 1e-14
    assert complex_rel_l2(mirror(expected, n1, n2), expected.conj()) < 1e-14


@pytest.mark.parametrize("precision", [None, "bf16", "fp16"])
def test_zero_and_tiny_channels(precision, gen):
    """The filter's 2^e at the ends of its range: an all-zero filter gives exact zeros (and D·u
    with a skip term); a filter scaled by 1e-40 (spectrum peak near 2^-140: 2^e = 2^141 is
    infinite in fp32) stays finite and within the budget, as float64 algebra exactly. Its 16-bit
    hand-off holds the values of a filter peaking at 2^-(13+p), not zeros: with the hand-off at the
    channel's own scale, fp16 lost every output from 1e-20 down, bf16 5% at 1e-40."""
    length, batch = 8192, 3
    engine = Engine(length, precision)
    bound = 1e-12 if precision is None else BUDGETS[precision]
    u = randn(gen, batch, length, dtype=torch.float64)
    zero = torch.zeros(length, dtype=torch.float64)
    assert torch.equal(engine.forward(u, ResidentFilter(engine, zero, 0.0)), torch.zeros_like(u))
    skip = 0.75
    assert rel_l2(engine.forward(u, ResidentFilter(engine, zero, skip)), skip * u) <= bound
    for scale in (1e-20, 1e-40):
        k = scale * randn(gen, length, dtype=torch.float64)
        filt = ResidentFilter(engine, k, 0.0)
        if scale == 1e-40:
            assert filt.unscale < 2.0**-127, "2^e finite in fp32: not the case tested"
        y = engine.forward(u, filt)
        assert torch.isfinite(y).all()
        assert rel_l2(y, reference(u, k.unsqueeze(0))) <= bound, scale


@pytest.mark.parametrize("poison", [math.nan, math.inf])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_a_nonfinite_sequence_stays_alone(poison, direction, gen):
    """A NaN/Inf in one sequence of a pair reaches its partner through the packed transform
    (so this test can fail); the engine's rule (recompute that pair unpacked) keeps the
    partner exact, and the poisoned sequence as non-finite as torch.fft makes it."""
    length, filter_len, batch = 1000, 700, 3
    engine = Engine(length)
    u, k, skip = channel_inputs(gen, batch, length, filter_len)
    dy = randn(gen, batch, length, dtype=torch.float64)
    poisoned = u if direction == "forward" else dy
    poisoned[1, 123] = poison  # pair (0, 1)
    if direction == "forward":
        filt = ResidentFilter(engine, k, skip)
        run = lambda isolate: engine.forward(u, filt, isolate)  # noqa: E731
        expected = reference(u, k.unsqueeze(0), torch.tensor([skip], dtype=torch.float64))
    else:
        filt = ResidentFilter(engine, k, skip, conjugate=True)
        run = lambda isolate: engine.backward(u, dy, filt, filter_len, isolate)[0]  # noqa: E731
        expected = autograd_reference(u, dy, k, skip)[0]
    assert not torch.isfinite(run(False)[0]).any()  # packed alone: the partner is lost
    got = run(True)
    assert torch.equal(torch.isfinite(got), torch.isfinite(expected))
    assert not torch.isfinite(got[1]).all()
    for b in (0, 2):
        assert rel_l2(got[b], expected[b]) < 1e-12


def autograd_reference(u, dy, k, skip):
    """du, dk, dD of the float64 torch.fft convolution, by autograd."""
    u, k = u.clone().requires_grad_(), k.unsqueeze(0).clone().requires_grad_()
    d = torch.tensor([skip], dtype=torch.float64, requires_grad=True)
    reference(u, k, d).backward(dy)
    return u.grad, k.grad[0], d.grad[0]


@pytest.mark.parametrize("length, filter_len", SIZES)
@pytest.mark.parametrize("batch", [3, 5])
def test_backward_matches_autograd(length, filter_len, batch, gen):
    engine = Engine(length)
    u, k, skip = channel_inputs(gen, batch, length, filter_len)
    dy = randn(gen, batch, length, dtype=torch.float64)
    du, dk, d_skip = engine.backward(u, dy, ResidentFilter(engine, k, skip, conjugate=True), filter_len)
    ref_du, ref_dk, ref_d_skip = autograd_reference(u, dy, k, skip)
    assert rel_l2(du, ref_du) < 1e-12
    assert rel_l2(dk, ref_dk) < 1e-12
    # dD = Σ dy·u cancels: its rounding scales with the terms' magnitude, not with the sum's
    # (a seed gave dD = 0.097 with an error of 1.9e-13). So the bound is taken from the terms.
    assert abs(d_skip - ref_d_skip) <= 1e-12 * (dy * u).norm()


def test_dk_cross_terms_fall_into_the_imaginary_part(gen):
    """conj(Z_u)·Z_dy = Σ conj(U_b)·DY_b + i·(conj(U_a)·DY_b − conj(U_b)·DY_a): the cross
    terms are i times the spectrum of a real sequence, so they land in the imaginary part of the
    inverse. They are as large as dk (dropping Re would fail), and the textbook route (unpack
    each pair's two spectra with the Hermitian split, X[N − f] read at the mirrored position)
    gives the same dk."""
    length, filter_len = 3001, 3001
    engine = Engine(length)
    u, k, skip = channel_inputs(gen, 4, length, filter_len)
    dy = randn(gen, 4, length, dtype=torch.float64)
    _, dk, _ = engine.backward(u, dy, ResidentFilter(engine, k, skip, conjugate=True), filter_len)
    n1, n2 = engine.n1, engine.n2
    packed = torch.zeros(n1, n2, dtype=torch.complex128)
    split = torch.zeros(n1, n2, dtype=torch.complex128)
    for u_seqs, dy_seqs in zip(engine.jobs(u), engine.jobs(dy)):
        z_u = engine.spectrum_job(u_seqs).view(-1, n1, n2)
        z_dy = engine.spectrum_job(dy_seqs).view(-1, n1, n2)
        for zu, zd in zip(z_u, z_dy):
            packed += zu.conj() * zd
            ua, ub = (zu + mirror(zu, n1, n2).conj()) / 2, (zu - mirror(zu, n1, n2).conj()) / 2j
            da, db = (zd + mirror(zd, n1, n2).conj()) / 2, (zd - mirror(zd, n1, n2).conj()) / 2j
            split += ua.conj() * da + ub.conj() * db
    p = torch.zeros(JOB_ROWS, n2, dtype=torch.complex128)
    p[:n1] = packed / engine.fft_size
    cross = engine.inverse_job(p, (1.0, 1.0))[0].imag[:filter_len]
    assert cross.norm() > 0.3 * dk.norm()
    p[:n1] = split / engine.fft_size
    via_split = engine.inverse_job(p, (1.0, 1.0))[0]
    assert via_split.imag.abs().max() < 1e-12 * via_split.real.abs().max()  # Hermitian: a real inverse
    assert rel_l2(via_split.real[:filter_len], dk) < 1e-12


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("filter_scale", ["randn", "randn/sqrt(L)"])
def test_rounding_model_meets_the_budgets(precision, filter_scale, gen):
    """Every GEMM operand, the resident filter and the parked u spectrum rounded to the operand
    type, at N = 16384: the predicted relative L2 error of y (fp32 I/O) within 60% of its
    budget, du and dk within 60% of 1.5 times it (the margin leaves room for what the model
    leaves out: fp32 accumulation and epilogues). Filters as the GPU tests (randn) and the
    benchmark (randn/sqrt(L)) draw them: the per-channel scale keeps fp16's small spectra normal."""
    length, batch = 8192, 3
    engine = Engine(length, precision)
    budget = BUDGETS[precision]
    errors = {"y": [], "du": [], "dk": []}
    for _ in range(2):  # channels
        u, k, skip = channel_inputs(gen, batch, length, length)
        k = k if filter_scale == "randn" else k / math.sqrt(length)
        dy = randn(gen, batch, length, dtype=torch.float64)
        y = engine.forward(u, ResidentFilter(engine, k, skip))
        du, dk, _ = engine.backward(u, dy, ResidentFilter(engine, k, skip, conjugate=True), length)
        ref_du, ref_dk, _ = autograd_reference(u, dy, k, skip)
        errors["y"].append(rel_l2(y, reference(u, k.unsqueeze(0), torch.tensor([skip], dtype=torch.float64))))
        errors["du"].append(rel_l2(du, ref_du))
        errors["dk"].append(rel_l2(dk, ref_dk))
    worst = {name: max(e) for name, e in errors.items()}
    print(f"{precision}, filter {filter_scale}: " + ", ".join(f"{n} {e:.2e}" for n, e in worst.items())
          + f" (budget {budget:g}, gradients {1.5 * budget:g})")
    margin = 0.6
    assert worst["y"] <= margin * budget
    assert worst["du"] <= margin * 1.5 * budget and worst["dk"] <= margin * 1.5 * budget


# ==================================================================== fp16's range

def _constant_input_outputs(engine, mean, k):
    u = torch.full((2, engine.length), float(mean), dtype=torch.float64)
    return engine.forward(u, ResidentFilter(engine, k, 0.0)), reference(u, k.unsqueeze(0))


FP16_RANGE_FILTERS = {
    "one tap": lambda length: torch.ones(1, dtype=torch.float64),
    "low-pass": lambda length: torch.exp(-torch.arange(length, dtype=torch.float64) / 500.0),
}


@pytest.mark.parametrize("filter_name", list(FP16_RANGE_FILTERS))
def test_fp16_keeps_inputs_of_mean_8_and_64_at_the_default_peak_exponent_and_overflowed_at_0(filter_name,
                                                                                              monkeypatch):
    """Why the peak exponent is 7 and not 0, and why fp16 is back on the engine route
    (backends.ENGINE_ROUTE_PRECISIONS). At the default p = 7 a constant input of 8 and of 64 at
    L = 8192 (Σu = 65536 and 524288) comes back within fp16's budget through either filter. At
    p = 0, the old default (the filter's peak scaled into [1, 2)), the filtered spectrum's DC bin
    is about Σu, rounded to fp16 at inverse 2: a constant 3 (Σu = 24576) is exact, but 8 comes
    back inf/NaN through either filter (exp(-t/500)'s first failure is at 4.09, one tap's at 8);
    bf16 keeps fp32's range at either exponent."""
    import sys

    assert FILTER_PEAK_EXPONENT == 7  # the kernel's default: test_the_models_scale_constants_are_the_kernels
    length = 8192
    k = FP16_RANGE_FILTERS[filter_name](length)
    for mean in (8, 64):
        y, want = _constant_input_outputs(Engine(length, "fp16"), mean, k)
        assert torch.isfinite(y).all() and rel_l2(y, want) <= BUDGETS["fp16"], mean
    monkeypatch.setattr(sys.modules[__name__], "FILTER_PEAK_EXPONENT", 0)
    y, want = _constant_input_outputs(Engine(length, "fp16"), 3, k)
    assert rel_l2(y, want) <= BUDGETS["fp16"]
    y, want = _constant_input_outputs(Engine(length, "fp16"), 8, k)
    assert not torch.isfinite(y).all()
    y, want = _constant_input_outputs(Engine(length, "bf16"), 8, k)
    assert rel_l2(y, want) <= BUDGETS["bf16"]


@pytest.mark.parametrize("filter_name", list(FP16_RANGE_FILTERS))
def test_a_filter_peak_near_2_to_the_minus_7_lifts_the_fp16_ceiling_and_keeps_the_floor(filter_name, monkeypatch,
                                                                                         gen):
    """The default since session 30 (docs/design.md, "fp16's range"; on an H200 in session 30: fp16
    means 8-200 finite, 400 through exp(-t/500) not, as here), beside
    the old default 0: the peak in [2^-7, 2^-6) puts the engine's ceiling where the mma.sync kernel's is (the portable engine, its model: a
    constant input just under it exact, just over it not finite, through either filter; p = 0 fails
    at 4-8), for the same error at unit scale and at most 2.5x p = 0's at the input's own fp16 floor
    (rms 1e-5, where u itself is subnormal: 4.4e-3 against 2.2e-3 on one draw)."""
    import sys

    import monarch_fftconv as mf

    length = 8192
    k = FP16_RANGE_FILTERS[filter_name](length)
    decaying = randn(gen, length, dtype=torch.float64) * torch.exp(-torch.arange(length) / 500.0)
    u = randn(gen, 2, length, dtype=torch.float64)
    errors = {}
    for p in (0, 7):
        monkeypatch.setattr(sys.modules[__name__], "FILTER_PEAK_EXPONENT", p)
        engine = Engine(length, "fp16")
        errors[p] = [rel_l2(engine.forward(u * scale, ResidentFilter(engine, decaying, 0.0)),
                            reference(u * scale, decaying.unsqueeze(0))) for scale in (1.0, 1e-5)]

    monkeypatch.setenv("MONARCH_FFTCONV_BACKEND", "portable")

    def mma_finite(mean):  # the mma.sync kernel's model: the portable engine
        u = torch.full((1, 1, length), mean)
        return bool(torch.isfinite(mf.fftconv(u, k.float().unsqueeze(0), precision="fp16")).all())

    low, high = 1.0, 4096.0  # the mma.sync kernel's ceiling, to 1/128 of its octave
    assert mma_finite(low) and not mma_finite(high)
    while high - low > high / 128:
        low, high = ((low + high) / 2, high) if mma_finite((low + high) / 2) else (low, (low + high) / 2)
    y, want = _constant_input_outputs(engine, 0.97 * low, k)  # p = 7
    assert rel_l2(y, want) <= BUDGETS["fp16"]
    monkeypatch.setattr(sys.modules[__name__], "FILTER_PEAK_EXPONENT", 0)
    y, _ = _constant_input_outputs(Engine(length, "fp16"), 0.97 * low, k)
    assert not torch.isfinite(y).all()
    assert errors[7][0] <= 1.01 * errors[0][0] and errors[7][0] <= BUDGETS["fp16"] / 2
    assert errors[7][1] <= 2.5 * errors[0][1]


def test_the_models_scale_constants_are_the_kernels():
    """HANDOFF_EXPONENT and FILTER_PEAK_EXPONENT are engine_traits.cuh's (the latter's default,
    the build every GPU test runs unless MONARCH_FFTCONV_NVCC_DEFINES names another), and
    filter_exponent/filter_unscales apply them as the model does."""
    import re

    from monarch_fftconv import _extension

    traits = (_extension.CSRC / "tc" / "engine_traits.cuh").read_text()
    producer = (_extension.CSRC / "tc" / "engine_producer.cuh").read_text()
    assert re.findall(r"kHandoffExponent = (\d+);", traits) == [str(HANDOFF_EXPONENT)]
    assert re.findall(r"#define MONARCH_FFTCONV_ENGINE_FILTER_PEAK_EXPONENT (\d+)", traits) == [str(FILTER_PEAK_EXPONENT)]
    assert "e = 1 - x - Cfg::kFilterPeakExponent;" in producer
    assert "to_handoff = max(to_handoff, -127)" in producer


@pytest.mark.parametrize("peak_exponent", [0, 6, 7, 10])
def test_both_unscales_stay_finite_powers_of_two_at_every_exponent(peak_exponent, monkeypatch):
    """Every e an fp32 spectrum gives (its peak in [2^-149, 2^128)), shifted by p: the hand-off's
    and y's unscales are fp32 powers of two (y's reaches 2^-136, a subnormal, exact) whose
    product undoes 2^e exactly."""
    import sys

    monkeypatch.setattr(sys.modules[__name__], "FILTER_PEAK_EXPONENT", peak_exponent)
    smallest, largest = 2.0**-149, torch.finfo(torch.float32).max  # fp32's smallest subnormal
    for unshifted in FP32_EXPONENTS:
        e = unshifted - peak_exponent
        handoff, output = _unscales(e)
        for factor in (handoff, output):
            assert smallest <= factor <= largest and math.frexp(factor)[0] == 0.5
        assert math.ldexp(handoff * output, e) == 1.0
