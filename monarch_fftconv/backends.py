"""Where a call runs: the backends, and the one place that chooses among them.

A backend owns everything a call needs from it: the differentiable convolution, the filter
spectrum in its own layout with the convolution from it (the module's inference cache), and
the flop count of its algorithm. `select_backend` decides once per (device, dtype,
precision, plan, and for bf16/fp16 whether the call fills the GPU with the fp32 kernel) and
remembers the decision; `explain()` and the call share it.

=====================  ==========================================================
``cuda-fp32``          the fused fp32 radix kernel (Hopper, N = 256 .. 32768); at N = 32768,
                       where no tensor-core kernel runs, for every precision
``cuda-tensor-core``   the fused Monarch kernel on tensor cores (Hopper, N = 256 .. 16384), bf16 and
                       fp16 on calls too small to fill the GPU with the fp32 kernel (on larger ones the
                       fp32 kernel measured faster: `fp32_kernel_is_faster`); tf32 at N <= 4096 on calls
                       below half that size
``cuda-four-step``     long sequences (Hopper, N = 65536 .. 2^23, L <= 4M): the four-step kernels, an outer
                       DFT down the columns, the fused inner FFT conv along the rows and the outer
                       inverse, in fp32 for every precision
``torch.fft``          torch.fft in fp32 (fp64 for fp64 input): CPU tensors, GPU calls no
                       kernel covers, and bidirectional filters on every device; faster than
                       emulating a precision, and at least as accurate
``portable``           the monarch_fftconv ops, on request: ``MONARCH_FFTCONV_BACKEND=portable``
                       (read at call time). On CPU tensors they run the PyTorch Monarch engine
                       with emulated operand precision, the executable spec the kernels are
                       tested against; on CUDA tensors, the fused kernels (the ops' CUDA
                       implementations: the decision loads the extension that registers them).
=====================  ==========================================================
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from . import _extension, fourstep, ops, torch_fft
from .bidirectional import BidirectionalConv
from .planner import MonarchPlan, plan_for, real_fft_flops


def _radix_conv_flops(plan: MonarchPlan, batch: int, channels: int, filters: int | None = None) -> int:
    """Forward and inverse real FFT and the complex product per sequence, one FFT per filter
    row (default: one per channel)."""
    n = plan.fft_size
    per_sequence = 2 * real_fft_flops(n) + 6 * (n // 2 + 1)
    return int(batch * channels * per_sequence + (channels if filters is None else filters) * real_fft_flops(n))


@dataclass(frozen=True)
class Backend:
    """u is (B, C, L); k is a filter bank of G rows, G dividing C, channel c taking row
    c // (C // G): (G, Lk) causal, or (G, 2, Lk) bidirectional (`BidirectionalOps` and torch.fft)."""

    name: str
    kernel: str  # what runs, in words
    reason: str  # why this backend
    runs_as: str | None = None  # the precision the kernels are asked for, when not the call's
    # where the skip term D·x is computed (explain()'s "terms")
    skip_term: ClassVar[str] = "inside the convolution op (the CUDA kernels fuse it into their store)"

    def fftconv(self, u: Tensor, k: Tensor, skip: Tensor | None, precision: str) -> Tensor:
        """y = conv(u, k) (+ skip·u), differentiable in u, k and skip."""
        raise NotImplementedError

    def filter_spectrum(self, k: Tensor, seq_len: int, precision: str) -> Tensor:
        """k's spectrum in this backend's layout, one row per filter (not differentiable)."""
        raise NotImplementedError

    def conv(self, u: Tensor, spectrum: Tensor, skip: Tensor | None, precision: str) -> Tensor:
        """y from a `filter_spectrum` (not differentiable in the spectrum)."""
        raise NotImplementedError

    # Whether `gated_conv` fuses the gates into the kernel (explain()'s "terms").
    fuses_gates: ClassVar[bool] = False

    def gated_conv(self, u: Tensor, spectrum: Tensor, skip: Tensor | None, pregate: Tensor | None,
                   postgate: Tensor | None, precision: str) -> Tensor:
        """postgate ⊙ (conv(x) + skip·x), x = pregate ⊙ u, from a `filter_spectrum`, for inference
        (not differentiable); each gate optional, of u's shape and dtype. Called only where
        `fuses_gates` (functional._gates_fusable); elsewhere the gates stay elementwise ops."""
        raise NotImplementedError

    def refreshes_in_place(self, k: Tensor, seq_len: int) -> bool:
        """Whether `refresh_spectrum` can bring a cached spectrum of k up to date on k's device
        without a host sync (a CUDA kernel that compares and recomputes the changed rows)."""
        return False

    def refresh_spectrum(self, k: Tensor, source: Tensor, spectrum: Tensor, seq_len: int, precision: str) -> None:
        """`spectrum`, computed from `source`, recomputed in place where k differs from source,
        bit for bit, and source updated (where `refreshes_in_place`)."""
        raise NotImplementedError

    def flops(self, plan: MonarchPlan, batch: int, channels: int, filters: int | None = None) -> int | None:
        """Real flops of one forward call as this backend's algorithm does it (FMA = 2).
        `filters`: the filter rows the call gives (G, or 2G bidirectional; default C)."""
        raise NotImplementedError

    def arithmetic(self, precision: str, dtype: torch.dtype) -> str | None:
        """What the call computes in, which the precision flag bounds but need not name (a
        float64 input under "fp32" computes in fp64; a bf16 call on the fp32 kernel in fp32)."""
        return "fp32"

    def stages(
        self, plan: MonarchPlan, batch: int, channels: int, itemsize: int, filters: int | None = None,
    ) -> list[dict] | None:
        """The launches of one forward call in order, each {"stage", "reads", "writes"} with the
        HBM bytes it moves at least (itemsize: u's element size; filters: the spectrum's rows,
        G of a grouped bank); None when not known."""
        return None


def _filter_rows(rows: Tensor, channels: int) -> Tensor:
    """What the ops are given of a G-row filter bank (filters or spectra): the G rows themselves
    where the ops take groups (GROUPS_IN_KERNELS), else a row per channel (`_per_channel`)."""
    return rows if GROUPS_IN_KERNELS else _per_channel(rows, channels)


def _transformed_rows(channels: int, filters: int | None) -> int:
    """The filter rows the ops transform: the bank's own (G, or 2G bidirectional) where the ops
    take groups (GROUPS_IN_KERNELS), else one a channel."""
    return filters if GROUPS_IN_KERNELS and filters is not None else channels


def _per_channel(rows: Tensor, channels: int) -> Tensor:
    """Row c // (C // G) of a G-row filter bank (filters or spectra) for each channel c: each
    row repeated over its group, a copy of C rows. Its gradient, the sum over each group, is
    expand's backward: a plain reduction, deterministic."""
    groups = rows.shape[0]
    if groups == channels:
        return rows
    return rows.unsqueeze(1).expand(groups, channels // groups, *rows.shape[1:]).flatten(0, 1)


class _MonarchOps(Backend):
    """Runs the monarch_fftconv ops; the dispatcher picks their CPU or CUDA implementation.

    Grouped filters: the ops take a spectrum of G rows (G dividing C) and return a filter
    gradient of G rows, each its channels' sum (inside, the ungated fp32 radix kernels read the
    rows by a shift where C/G is a power of two, other kernels take them repeated, and the channels'
    gradients are summed after). With GROUPS_IN_KERNELS off (the route it replaced, kept for the
    benchmark's A/B) the G filters are repeated over their groups before the op (`_filter_rows`),
    which then transforms C filters, each group's C/G times."""

    def fftconv(self, u, k, skip, precision):
        return ops.fftconv_op(u, _filter_rows(k, u.shape[1]), skip, self.runs_as or precision)[0]

    def filter_spectrum(self, k, seq_len, precision):
        return ops.filter_spectrum_op(k, seq_len, self.runs_as or precision)

    def conv(self, u, spectrum, skip, precision):
        return ops.conv_forward_op(u, _filter_rows(spectrum, u.shape[1]), skip, self.runs_as or precision)

    def gated_conv(self, u, spectrum, skip, pregate, postgate, precision):
        return ops.gated_conv_forward_op(u, _filter_rows(spectrum, u.shape[1]), skip, pregate, postgate,
                                         self.runs_as or precision)

    def refreshes_in_place(self, k, seq_len):
        # the radix spectrum kernel, which takes fp32 filters (a float64 one computes in float64)
        return k.is_cuda and k.dtype != torch.float64 and not fourstep.covers(plan_for(seq_len).fft_size)

    def refresh_spectrum(self, k, source, spectrum, seq_len, precision):
        ops.refresh_filter_spectrum_op(k, source, spectrum, seq_len, self.runs_as or precision)

    def stages(self, plan, batch, channels, itemsize, filters=None):
        grouped = filters not in (None, channels)
        in_kernels = grouped and GROUPS_IN_KERNELS
        launches = self._conv_stages(plan, batch, channels, itemsize, filters if in_kernels else channels)
        if launches is None or not grouped:
            return launches
        if not in_kernels:
            repeat = {"stage": f"repeat the {filters} filters over their groups (ATen copy)",
                      "reads": filters * plan.seq_len * 4, "writes": channels * plan.seq_len * 4}
            return [repeat, *launches]
        if self._reads_rows_by_shift(plan, channels // filters):
            return launches
        # the binding repeats the G spectrum rows for a kernel that takes one a channel
        spectrum_stages = [s for s in launches if s["stage"].startswith("filter spectrum")]
        spectrum_row = spectrum_stages[-1]["writes"] // filters
        repeat = {"stage": f"repeat the {filters} spectrum rows over their groups (in the op)",
                  "reads": filters * spectrum_row, "writes": channels * spectrum_row}
        return [*spectrum_stages, repeat, *launches[len(spectrum_stages):]]

    def _conv_stages(self, plan: MonarchPlan, batch: int, channels: int, itemsize: int,
                     spectrum_rows: int) -> list[dict] | None:
        return None

    def _reads_rows_by_shift(self, plan: MonarchPlan, group_size: int) -> bool:
        """Whether this backend's ungated kernel reads row c >> log2(group_size) of a grouped
        spectrum itself (the binding's kernel_rows)."""
        return False


class Portable(_MonarchOps):
    def arithmetic(self, precision, dtype):
        accumulate = _accumulate_dtype(dtype)
        return accumulate if precision == "fp32" else f"{precision} operands emulated, {accumulate} accumulation"

    def flops(self, plan, batch, channels, filters=None):
        per_sequence = plan.flops_per_sequence()
        return per_sequence * batch * channels + per_sequence // 2 * _transformed_rows(channels, filters)


def _fused_stages(plan: MonarchPlan, batch: int, channels: int, itemsize: int, spectrum_rows: int) -> list[dict]:
    spectrum = spectrum_rows * plan.half_rows * plan.row_size * 8  # complex64
    return [{"stage": "filter spectrum (one kernel)", "reads": spectrum_rows * plan.seq_len * 4, "writes": spectrum},
            {"stage": "fused conv, load to store", "reads": batch * channels * plan.seq_len * itemsize + spectrum,
             "writes": batch * channels * plan.seq_len * itemsize}]


class FusedFP32(_MonarchOps):
    fuses_gates = True  # gated_conv_forward: the gates in the kernel's load and store

    def flops(self, plan, batch, channels, filters=None):
        return _radix_conv_flops(plan, batch, channels, _transformed_rows(channels, filters))

    def _conv_stages(self, plan, batch, channels, itemsize, spectrum_rows):
        return _fused_stages(plan, batch, channels, itemsize, spectrum_rows)

    def _reads_rows_by_shift(self, plan, group_size):
        # the radix kernels (not the four-step's), a power-of-two group
        return not fourstep.covers(plan.fft_size) and group_size & (group_size - 1) == 0


class FusedTensorCore(_MonarchOps):
    def arithmetic(self, precision, dtype):
        return f"{precision} tensor-core operands, fp32 accumulation"

    def flops(self, plan, batch, channels, filters=None):
        # MMA flops as issued (padded tiles, conjugate columns), plus the C filters' FFTs
        mma = plan.tensor_core_flops_per_sequence() * batch * channels
        return int(mma + _transformed_rows(channels, filters) * real_fft_flops(plan.fft_size))

    def _conv_stages(self, plan, batch, channels, itemsize, spectrum_rows):
        return _fused_stages(plan, batch, channels, itemsize, spectrum_rows)


class TorchFFT(Backend):
    def arithmetic(self, precision, dtype):
        return _accumulate_dtype(dtype)

    skip_term = "an elementwise op after the inverse FFT"

    def fftconv(self, u, k, skip, precision):
        return torch_fft.fftconv(u, k, skip, plan_for(u.shape[-1]).fft_size)

    def filter_spectrum(self, k, seq_len, precision):
        return torch_fft.filter_spectrum(k, plan_for(seq_len))

    def conv(self, u, spectrum, skip, precision):
        return torch_fft.conv(u, spectrum, skip, plan_for(u.shape[-1]))

    def flops(self, plan, batch, channels, filters=None):
        return _radix_conv_flops(plan, batch, channels, filters)  # one FFT per filter row


class FourStep(_MonarchOps):
    """Every precision in fp32: the intermediate is fp32, the arithmetic fp32. The ops take the
    four-step layout at these N (fourstep.py)."""

    def flops(self, plan, batch, channels, filters=None):
        return _radix_conv_flops(plan, batch, channels, _transformed_rows(channels, filters))

    def _conv_stages(self, plan, batch, channels, itemsize, spectrum_rows):
        inner = fourstep.inner_for(plan.fft_size)
        rows = fourstep.spectrum_rows(plan.fft_size)
        filt = spectrum_rows * rows * inner * 8  # complex64
        scratch = batch * channels * rows * inner * 8  # the one complex intermediate
        u = batch * channels * plan.seq_len * itemsize
        return [
            {"stage": "filter spectrum: outer DFT of k", "reads": spectrum_rows * plan.seq_len * 4, "writes": filt},
            {"stage": "filter spectrum: inner FFT, in place", "reads": filt, "writes": filt},
            {"stage": f"outer forward: {plan.fft_size // inner}-point DFT down the columns", "reads": u,
             "writes": scratch},
            {"stage": f"inner: {inner}-point FFT, filter product, inverse, in place", "reads": scratch + filt,
             "writes": scratch},
            {"stage": "outer inverse: the first L outputs", "reads": scratch, "writes": u},
        ]


@dataclass(frozen=True)
class BidirectionalOps(Backend):
    """A causal Monarch backend run on bidirectional filters (bidirectional.py): the folded
    spectrum K_fwd + conj(K_rev) through the causal ops, forward and backward. The backward
    is one call of the two-sided backward op (both lag signs of one correlation)."""

    causal: _MonarchOps | None = None

    @classmethod
    def on(cls, causal: _MonarchOps) -> BidirectionalOps:
        return cls(causal.name, f"{causal.kernel}, on the folded spectrum K_fwd + conj(K_rev)",
                   f"bidirectional filters run where the causal call would: {causal.reason}", causal.runs_as, causal)

    def fftconv(self, u, k, skip, precision):
        return BidirectionalConv.apply(u, _filter_rows(k, u.shape[1]), skip, self.runs_as or precision)

    def filter_spectrum(self, k, seq_len, precision):
        return ops.filter_spectrum_two_sided_op(k, seq_len, self.causal.runs_as or precision)

    def conv(self, u, spectrum, skip, precision):
        return self.causal.conv(u, spectrum, skip, precision)

    def arithmetic(self, precision, dtype):
        return self.causal.arithmetic(precision, dtype)

    def _one_launch_spectrum(self) -> bool:
        """Whether the spectrum is one kernel on the two-sided circle (the CUDA radix layouts),
        not the two halves' spectra combined (the CPU ops, the four-step layout)."""
        return isinstance(self.causal, (FusedFP32, FusedTensorCore))

    def flops(self, plan, batch, channels, filters=None):
        causal = self.causal.flops(plan, batch, channels)
        if causal is None or self._one_launch_spectrum():
            return causal  # the circle's N-point FFT, as the causal filter's
        return causal + plan.flops_per_sequence() // 2 * channels  # one more filter-bank FFT: the anti-causal half

    def stages(self, plan, batch, channels, itemsize, filters=None):
        launches = self.causal.stages(plan, batch, channels, itemsize)
        if launches is None:
            return None
        if self._one_launch_spectrum():
            spectrum, *rest = launches
            two_sided = {**spectrum, "stage": "two-sided filter spectrum (one kernel)", "reads": 2 * spectrum["reads"]}
            return [two_sided, *rest]
        fold = {"stage": "the anti-causal half's filter spectrum, conjugated and added (ATen)",
                "reads": channels * plan.seq_len * 4, "writes": channels * plan.half_rows * plan.row_size * 8}
        return [fold, *launches]


class Pending(Backend):
    """explain() before the CUDA extension is loaded: it never builds, so it can't know yet."""

    skip_term = "decided by the first CUDA call"

    def flops(self, plan, batch, channels, filters=None):
        return None

    def arithmetic(self, precision, dtype):
        return None


# Where the tensor-core kernels measured slower than the fp32 kernel (docs/performance.md), the call
# takes the fp32 kernel: faster, and more accurate than asked. MONARCH_FFTCONV_BACKEND=portable still
# reaches the tensor-core kernels (the ops run the precision given).
# - bf16, fp16: slower on every call that fills the GPU with the fp32 kernel (e.g. 0.40 against
#   0.32 ms at 16x256x8192); faster on smaller calls, where the fp32 kernel leaves SMs idle
#   (3x5x1000: 0.023 against 0.063 ms).
# - tf32: its kernel takes ~2.3x bf16's time per sequence. At N <= 4096 it beat the fp32 kernel on
#   every call up to half a wave measured (3x5x1000: 0.026 against 0.060 ms; 2x256x2048: 0.051
#   against 0.062); at N = 16384 it lost even on one sequence a channel (1x7x8191: 0.091 against
#   0.058). N = 8192 was not measured, so it stays on the fp32 kernel (session 13's scan).
# The fp32 kernel holds 32768 points of N per SM whatever N (two CTAs of 256 threads, 32 complex
# values a thread: Plan in csrc/fp32/radix_plan.cuh), so a call fills the GPU once B·C·N reaches SMs × 32768.
FP32_KERNEL_POINTS_PER_SM = 32768
# The share of one fp32-kernel wave from which a precision's call takes the fp32 kernel.
TENSOR_CORE_WAVE_SHARE = {"bf16": 1.0, "fp16": 1.0, "tf32": 0.5}
# Grouped filters given to the ops as their G rows (the ops give them to the kernels, by shift or
# repeated, and sum each group's filter gradient inside), instead of repeated to a row per
# channel before the op.
# On since session 38: with the ungated fp32 radix kernels reading the rows by shift (C/G a power
# of two, session 37) it measured faster than the rows repeated before the op (H100, G = C/16,
# fwd+bwd: 0.7835 against 0.8029 ms at 16x256x8192, 8.100 against 8.208 at 64x768x8192; forward
# 0.2819 against 0.3105; bf16 I/O alike), and faster than the plain call (0.7914, 8.175).
# Sessions 19 and 36 had measured it 2% slower while the binding repeated the rows for every
# kernel, which it still does for the kernels that do not read by shift (docs/design.md).
GROUPS_IN_KERNELS = True

# The gates fused into the fp32 kernel (gated_conv_forward) for calls that record no gradient,
# where u (and so the gates) has one of FUSED_GATE_IO_DTYPES. On since session 18: with the
# gate's loads issued before its products (apply_gate), the fp32-I/O gated forward took 0.430 ms
# against the ATen gates' 0.618 at 16x256x8192 on an H100 (0.528 against 0.668 one call at a
# time; 0.249 against 0.353 at 16x256x4096). With bf16 I/O the fused kernel was the slower one
# (0.548 against 0.514, 0.359 against 0.325), so 2-byte I/O keeps the ATen gates (which round
# pregate ⊙ u to bf16: error 2.8e-3 against the fused 1.6e-3). docs/performance.md, session 18.
# False keeps the ATen gates everywhere.
FUSED_GATES = True
FUSED_GATE_IO_DTYPES = frozenset({torch.float32})

# The gated training step fused (issue #39): a call that records a gradient, on a backend whose
# kernel takes the gates, causal, u of FUSED_GATE_IO_DTYPES and gates of u's shape and dtype, runs
# ops.gated_fftconv (the fp32 forward kernel's gated instance, also storing z = conv(x) + D·x for
# the backward) and ops.gated_fftconv_backward (the fp32 grad kernel's gated instance: x =
# pregate ⊙ u and dz = postgate ⊙ dy at its loads, du = pregate ⊙ dx and dpregate = u ⊙ dx at its
# store), dpostgate = dy ⊙ z one ATen multiply: 14 full-tensor passes a step against the ATen
# gates' ~23 (docs/design.md, "The gated training step"). On since session 22: its GPU tests
# passed on an H100 and it measured 1.369 ms fwd+bwd against the ATen gates' 1.682 at
# 16x256x8192 fp32 (bench_cufft.py --operator gated --backward; docs/performance.md, session 22).
FUSED_GATED_TRAINING = True

# The fused gated training step's dpostgate = dy ⊙ z in the gated grad kernel (session 39; off
# until measured): each of its iterations multiplies the sequence's dy (read through L2, where the
# dy pass then finds it) by z and stores dpostgate, a streaming pass of its own, in place of the
# ATen multiply after the kernels (135 us of the 1,458 us step at 16x256x8192 fp32, H100,
# session 38). The same bits (one fp32 multiply either way). Predicted: the step -60 to -110 us
# at 16x256x8192 (the ATen pass's launch and its second read of dy gone; z and dpostgate still
# cross HBM once each, inside a kernel latency-bound at 1.77x its plain twin).
DPOSTGATE_IN_GRAD_KERNEL = False

# A bf16/fp16 call (and a tf32 one, where its tensor cores would run it) whose gates the fp32
# kernel fuses (both flags above on, u of FUSED_GATE_IO_DTYPES, causal, gates of u's shape and
# dtype) runs on the fp32 kernel, where the tensor-core kernels would take the gates as
# elementwise ATen passes around them (three more full-tensor passes forward, more backward).
# Measured side by side on an H100 (session 28, bench_cufft.py --operator gated, bf16 and fp16):
# 4.485 against 5.499 ms at 64x768x8192 forward, 1.455 against 1.595 at 16x256x8192 fwd+bwd;
# fp32-accurate, so within every precision's budget. Its GPU test passed in session 30 (H100).
GATED_CALLS_ON_FP32 = True

# bf16/fp16 calls (ENGINE_ROUTE_PRECISIONS) at N = 16384 with any I/O dtype (ENGINE_IO_DTYPES) and
# at least ENGINE_MIN_SEQUENCES sequences (B·C) routed to the tensor-core engine instead of the fp32
# kernel. 2-byte I/O since session 36 (H100, side by side with the fp32 kernel's same bf16 I/O:
# 0.256 against 0.317 ms at 16x256x8192, 2.29 against 3.24 at 64x768x8192).
# Through the public call, side by side with the fp32 kernel (H100, session 22): 0.303 against
# 0.340 ms at 16x256x8192, 0.505 against 0.642 at 32x256, 2.71 against 3.59 at 64x768; a tie at
# 2048 sequences, slower below. Error 3.9e-3 (bf16's budget 1e-2); fp16 at the peak exponent 7:
# 5.4e-4 (H100, session 30: 0.286 against 0.300 ms at 16x256x8192, 2.70 against 3.15 at
# 64x768x8192). On since session 22, when the route's GPU tests passed.
# tc/dispatch.cu's kEngineMinSequences is the same number: the binding runs the engine for such
# calls whatever this switch says, so this decides only whether they reach the tensor cores.
ENGINE_ROUTE = True
ENGINE_MIN_SEQUENCES = 4096
# The precisions the route takes there: both the engine runs. fp16 was off it in session 29: the
# engine then scaled each channel's filter spectrum to a peak in [1, 2), so the filtered spectrum
# was rounded to fp16 at about the input spectrum's own size, and an input of mean 4-8 at L = 8192
# (a DC bin of 32768-65536) overflowed it to inf/NaN. It is back since session 30, when the peak
# exponent (engine_traits.cuh, MONARCH_FFTCONV_ENGINE_FILTER_PEAK_EXPONENT) became 7: the peak in
# [2^-7, 2^-6) leaves the engine's fp16 the mma.sync kernel's own ceiling, a constant input of 1023
# at L = 8192 through one tap, 262 through exp(-t/500) (docs/design.md, "fp16's range"; the CPU
# model, tests/test_tc_engine_dataflow.py; on an H200, session 30: means 8-200 finite, 400
# through exp(-t/500) not). A build with the exponent at 0 must take fp16 off again.
# tc/dispatch.cu's route takes the same precisions; change both together: explain() names the
# kernel from this tuple. A precision the engine covers but this tuple leaves out takes the fp32
# kernel at the route's size (_decide), as every such call did before the route.
ENGINE_ROUTE_PRECISIONS = ("bf16", "fp16")
ENGINE_FACTORS = (128, 128)

TF32_TENSOR_CORE_MAX_FFT = 4096  # the largest N at which tf32's tensor-core kernel measured faster
SIZE_DEPENDENT_PRECISIONS = tuple(TENSOR_CORE_WAVE_SHARE)  # the precisions whose choice depends on B·C


def fills_fp32_kernel(device: torch.device, plan: MonarchPlan, sequences: int, share: float = 1.0) -> bool:
    """Whether B·C = `sequences` sequences of `plan` fill `share` of the GPU once with the fp32 kernel."""
    return sequences * plan.fft_size >= share * _multiprocessors(device) * FP32_KERNEL_POINTS_PER_SM


_MULTIPROCESSORS: dict[torch.device, int] = {}


# A constant to torch.compile: asked once per device, eagerly, also while a graph is traced.
@torch.compiler.assume_constant_result
def _multiprocessors(device: torch.device) -> int:
    if (count := _MULTIPROCESSORS.get(device)) is None:
        count = _MULTIPROCESSORS[device] = torch.cuda.get_device_properties(device).multi_processor_count
    return count


def fp32_kernel_is_faster(precision: str, fills: bool, fft_size: int = 0) -> str | None:
    """Why the fp32 kernel serves a `precision` call of FFT size `fft_size` (`fills`:
    fills_fp32_kernel at the precision's TENSOR_CORE_WAVE_SHARE), or None."""
    if precision == "tf32" and fft_size > TF32_TENSOR_CORE_MAX_FFT:
        return (f"at N={fft_size} the tf32 tensor-core kernel measured slower than the fp32 kernel at every "
                f"size: the fp32 kernel serves tf32, faster and more accurate than asked")
    if precision in SIZE_DEPENDENT_PRECISIONS and fills:
        share = TENSOR_CORE_WAVE_SHARE[precision]
        portion = "the GPU" if share == 1.0 else f"{share:g} of the GPU"
        return (f"this call fills {portion} with the fp32 kernel, which then measured faster than the {precision} "
                f"tensor-core kernel: it serves {precision}, more accurate than asked")
    return None


BACKEND_ENV = "MONARCH_FFTCONV_BACKEND"
BACKEND_CHOICES = ("auto", "portable")

_decisions: dict[tuple, Backend] = {}

# Which tensor-core kernel runs the 128x128 split (N = 16384) in bf16/fp16 (tc/dispatch.cu,
# pick_hopper): unset, the tensor-core engine for bf16/fp16 calls of ENGINE_MIN_SEQUENCES or more
# and the mma.sync kernel otherwise; "engine" the engine at any size (docs/design.md, "The next
# tensor-core engine"); "mma" the mma.sync kernel at any size; any other value
# is refused (here and by the binding: a misspelt name must not run another kernel). The binding
# reads the same variable per call; here it names the kernel in explain() and keeps a named kernel
# off the engine route.
TC_KERNEL_ENV = "MONARCH_FFTCONV_TC_KERNEL"
TC_KERNEL_CHOICES = ("engine", "mma")


def requested_tc_kernel() -> str:
    """The tensor-core kernel the environment names: "" (unset: the route), "engine" or "mma"."""
    choice = os.environ.get(TC_KERNEL_ENV, "")
    if choice and choice not in TC_KERNEL_CHOICES:
        raise ValueError(f"{TC_KERNEL_ENV} must be one of {', '.join(map(repr, TC_KERNEL_CHOICES))} or unset, "
                         f"got {choice!r}")
    return choice


# The I/O dtypes the engine reads and writes as they are (2-byte I/O since session 36).
ENGINE_IO_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def engine_applies(plan: MonarchPlan, precision: str, dtype: torch.dtype) -> bool:
    """Whether the tensor-core engine covers a call: split 128x128, bf16/fp16, fp32/bf16/fp16 I/O."""
    return plan.factors == ENGINE_FACTORS and precision in ("bf16", "fp16") and dtype in ENGINE_IO_DTYPES


def _tensor_core_kernel(plan: MonarchPlan, precision: str, dtype: torch.dtype, sequences: int = 1) -> str:
    """The tensor-core kernel tc/dispatch.cu runs for the call (pick_hopper)."""
    requested = requested_tc_kernel()
    if plan.factors != ENGINE_FACTORS or precision not in ("bf16", "fp16"):
        return "the mma.sync kernel"
    if engine_applies(plan, precision, dtype):
        if requested == "engine":
            return "the tensor-core engine (on request)"
        if not requested and sequences >= ENGINE_MIN_SEQUENCES and precision in ENGINE_ROUTE_PRECISIONS:
            return f"the tensor-core engine (B·C >= {ENGINE_MIN_SEQUENCES})"
    return "the mma.sync kernel"


def requested_backend() -> str:
    """The backend the environment asks for: "auto" (the default) or "portable"."""
    choice = os.environ.get(BACKEND_ENV) or "auto"
    if choice not in BACKEND_CHOICES:
        raise ValueError(f"{BACKEND_ENV} must be one of {', '.join(map(repr, BACKEND_CHOICES))}, got {choice!r}")
    return choice


def select_backend(
    device: torch.device, dtype: torch.dtype, precision: str, plan: MonarchPlan, sequences: int = 1, *,
    build: bool = True, bidirectional: bool = False, fp32_fuses_gates: bool = False,
) -> Backend:
    """The one place that decides where a call runs; `sequences` is the call's B·C;
    `fp32_fuses_gates`: the call has gates the fp32 kernel would take into its load and store
    (functional decides it from the gates). With build=False (explain) the CUDA extension is never
    built; the answer may then be `Pending`."""
    requested = requested_backend()
    tc_kernel = requested_tc_kernel()
    on_gpu = device.type == "cuda"
    fills = (on_gpu and precision in SIZE_DEPENDENT_PRECISIONS
             and fills_fp32_kernel(device, plan, sequences, TENSOR_CORE_WAVE_SHARE[precision]))
    # where tc/dispatch.cu runs the engine for a tensor-core call (pick_hopper)
    engine_size = on_gpu and sequences >= ENGINE_MIN_SEQUENCES and engine_applies(plan, precision, dtype)
    gates_to_fp32 = on_gpu and fp32_fuses_gates and GATED_CALLS_ON_FP32
    key = (device, dtype, precision, plan, fills, engine_size, ENGINE_ROUTE, tuple(ENGINE_ROUTE_PRECISIONS), requested,
           on_gpu and tc_kernel, bidirectional, gates_to_fp32)
    if (decided := _decisions.get(key)) is not None:
        return decided
    backend = _decide(device, dtype, precision, plan, fills, build, requested, engine_size=engine_size,
                      gates_to_fp32=gates_to_fp32)
    if bidirectional:
        backend = _bidirectional(backend)
    # Remembered by eager calls only: a compiled graph decides at trace time, where storing
    # into a global would have to be replayed after the graph.
    if not isinstance(backend, Pending) and not torch.compiler.is_compiling():
        _decisions[key] = backend
    return backend


def _bidirectional(causal: Backend) -> Backend:
    """Bidirectional filters run where the causal call would, on the folded spectrum
    K_fwd + conj(K_rev) (bidirectional.py): the Monarch ops' layouts hold one value per
    frequency, so the conjugate is taken bin by bin. torch.fft takes the (G, 2, Lk) filters
    itself; a backend not known yet stays pending."""
    if isinstance(causal, _MonarchOps):
        return BidirectionalOps.on(causal)
    if isinstance(causal, TorchFFT):
        return dataclasses.replace(causal, reason=f"bidirectional filters, where the causal call would run: "
                                                  f"{causal.reason}")
    return causal


def _accumulate_dtype(dtype: torch.dtype) -> str:
    """What torch.fft and the portable engine compute in for input of `dtype`."""
    return "fp64" if dtype == torch.float64 else "fp32"


def _decide(
    device: torch.device, dtype: torch.dtype, precision: str, plan: MonarchPlan, fills: bool, build: bool,
    requested: str, *, engine_size: bool = False, gates_to_fp32: bool = False,
) -> Backend:
    """The backend of a call; engine_size: a call the engine covers with B·C >=
    ENGINE_MIN_SEQUENCES, which the binding runs on the engine if it reaches the tensor cores;
    gates_to_fp32: gates the fp32 kernel fuses, which send a half-precision call there
    (GATED_CALLS_ON_FP32)."""
    factors = "x".join(map(str, plan.factors))
    if requested == "portable":
        if device.type == "cuda" and build:
            # The ops' CUDA implementations are registered by loading the extension: without
            # this, a process whose first CUDA call asks for the ops finds none (NotImplementedError).
            if isinstance(coverage := _extension.coverage(True), str):
                raise RuntimeError(f"{BACKEND_ENV}=portable on a CUDA tensor runs the ops' CUDA kernels, "
                                   f"which are unavailable: {coverage}")
        return Portable("portable", f"PyTorch Monarch {factors}, {precision} operands emulated",
                        f"{BACKEND_ENV}=portable asks for the emulating engine")
    fft_dtype = _accumulate_dtype(dtype)
    if device.type != "cuda":
        return TorchFFT("torch.fft", f"torch.fft rfft/irfft in {fft_dtype} on {device.type}, N={plan.fft_size}",
                        f"no kernel of this package runs on {device.type}: torch.fft, the same calls as the plain "
                        f"model, at least as accurate as any precision asks ({BACKEND_ENV}=portable runs the "
                        f"PyTorch Monarch engine, the kernels' executable spec; it emulates operand rounding, and "
                        f"measured faster only on very long single sequences, e.g. 1x1x2^20)")
    fallback = f"cuFFT rfft/irfft in {fft_dtype}, N={plan.fft_size}"
    coverage = _extension.coverage(build)
    if coverage is None:
        return Pending("pending", "decided by the first CUDA call, which loads or builds the CUDA extension",
                       "the CUDA extension is not loaded yet, and explain() never builds it")
    if isinstance(coverage, str):
        return TorchFFT("torch.fft", fallback, f"no CUDA kernel: {coverage}")
    kernels = coverage.kernel_for(plan, dtype)
    if kernels is None and coverage.fourstep_covers(plan, dtype):
        inner = fourstep.inner_for(plan.fft_size)
        outer = plan.fft_size // inner
        return FourStep("cuda-four-step",
                        f"four-step fp32 FFT conv, N={plan.fft_size} = {outer}x{inner}: outer {outer}-point DFT, "
                        f"fused inner {inner}-point FFT conv, outer inverse",
                        f"N={plan.fft_size} is beyond the fused kernels; the four-step kernels cover it in fp32"
                        + ("" if precision == "fp32" else f", more accurate than {precision}"))
    if kernels is None:
        sizes = "/".join(map(str, coverage.fft_sizes()))
        dtypes = "/".join(sorted(str(d).removeprefix("torch.") for d in coverage.io_dtypes))
        return TorchFFT("torch.fft", fallback,
                        f"no CUDA kernel for N={plan.fft_size} ({factors}) with {str(dtype).removeprefix('torch.')}"
                        f" I/O: the kernels cover N = {sizes} and {dtypes} I/O")
    if precision == "fp32":
        return fp32_kernel(plan, "the fp32-accurate fused kernel covers this call")
    if kernels == "radix":
        return fp32_kernel(plan, f"no tensor-core kernel at N={plan.fft_size}: the fp32-accurate fused kernel serves "
                           f"{precision}, more accurate than asked")
    if gates_to_fp32 and requested_tc_kernel() == "":
        return fp32_kernel(plan, f"gates the fp32 kernel takes into its load and store, which the tensor-core kernels "
                           f"would run as elementwise passes: the fp32 kernel measured faster (H100: 1.23x at "
                           f"64x768x8192 forward, 1.10x at 16x256x8192 fwd+bwd; backends.GATED_CALLS_ON_FP32), "
                           f"more accurate than {precision}", runs_as="fp32")
    # a precision the engine covers (bf16/fp16: engine_size) that the route leaves out
    if ENGINE_ROUTE and engine_size and precision not in ENGINE_ROUTE_PRECISIONS and requested_tc_kernel() == "":
        return fp32_kernel(plan, f"B·C >= {ENGINE_MIN_SEQUENCES} sequences at N={plan.fft_size} would take the "
                           f"tensor-core engine, whose route leaves {precision} out (backends.ENGINE_ROUTE_PRECISIONS: "
                           f"{'/'.join(ENGINE_ROUTE_PRECISIONS) or 'none'}; docs/design.md, \"fp16's range\"): the "
                           f"fp32 kernel serves {precision}, more accurate than asked", runs_as="fp32")
    # the engine route; a kernel named in TC_KERNEL_ENV other than the engine keeps the fp32 route
    if ENGINE_ROUTE and engine_size and requested_tc_kernel() in ("", "engine"):
        return tensor_core_backend(
            plan, precision, dtype, ENGINE_MIN_SEQUENCES,
            reason=f"B·C >= {ENGINE_MIN_SEQUENCES} sequences at N={plan.fft_size}: the tensor-core engine measured "
                   f"faster than the fp32 kernel there (H100, session 36, float32 I/O: 1.13x at 16x256x8192, 1.29x at "
                   f"64x768x8192; bfloat16 I/O: 1.24x and 1.41x; float16 and mixed I/O routed alike, unmeasured)")
    if (why := fp32_kernel_is_faster(precision, fills, plan.fft_size)) is not None:
        return fp32_kernel(plan, why, runs_as="fp32")
    return tensor_core_backend(plan, precision, dtype, ENGINE_MIN_SEQUENCES if engine_size else 1)


def fp32_kernel(plan: MonarchPlan, reason: str, runs_as: str | None = None) -> FusedFP32:
    """The fused fp32 radix kernel at the plan's N, for `reason`; `runs_as`: the precision it is
    asked for when not the call's (a half-precision call it serves in fp32)."""
    return FusedFP32("cuda-fp32", f"fused fp32 radix FFT conv, N={plan.fft_size}", reason, runs_as=runs_as)


def tensor_core_backend(plan: MonarchPlan, precision: str, dtype: torch.dtype = torch.float32, sequences: int = 1,
                        reason: str = "the fused tensor-core kernel covers this call") -> FusedTensorCore:
    """The fused tensor-core kernel of `precision` at a split it covers, for a call of `sequences`
    sequences: what a call takes unless `fp32_kernel_is_faster` sends it to the fp32 kernel (the
    benchmark's monarch-tc methods run it regardless, through the op)."""
    factors = "x".join(map(str, plan.factors))
    return FusedTensorCore("cuda-tensor-core", f"fused Monarch {factors} on tensor cores, {precision} operands, "
                           f"{_tensor_core_kernel(plan, precision, dtype, sequences)}", reason)
