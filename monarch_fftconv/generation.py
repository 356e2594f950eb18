"""Exact token-by-token generation for long convolutions: `prefill` a prompt, then `step` one
position at a time in amortised O(log² L) work per token per channel.

The schedule (docs/design.md, "Generation: prefill and step") is the block tiling of Flash
Inference (Oncescu et al., ICLR 2025, arXiv:2410.12982) with FutureFill's prefill cache
(Agarwal et al., arXiv:2410.03766): the prompt's contribution to every future position is one
FFT convolution at prefill; after generated step i, the last n = 2^q inputs (n the largest
power of two dividing i + 1) are convolved with the filter taps k[0 .. 2n-1] and added to the
next n positions. Every pair (s, t), s < t, is covered by exactly one such block, before t.

The schedule depends only on the position, a Python integer in the state: a step never reads
a tensor on the host and its tensors have shapes fixed per level. The state is updated in
place; the functions return it for the `y, state = ...` style.

Functional form: `prefill(x, k, max_len)` and `step(x_t, state)`. The modules' methods
(`FFTConv.prefill/step`, `HyenaOperator.prefill/step`) delegate to `prefill_fftconv`,
`step_fftconv`, `prefill_hyena` and `step_hyena`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.optim.optimizer import register_optimizer_step_post_hook

from . import _extension, ops, policy
from .functional import fftconv
from .planner import compute_dtype

if TYPE_CHECKING:
    from .hyena import HyenaOperator
    from .nn import FFTConv

__all__ = ["ConvState", "HyenaState", "prefill", "step"]

DIRECT_MAX_BLOCK = 8  # blocks up to this size: a small Toeplitz product, cheaper than two FFTs (CPU, C = 256)
# The graphed steps' per-token part (input, output, level 0's fold) and, at the Toeplitz levels
# (n = 2 .. DIRECT_MAX_BLOCK), the level's block as one CUDA kernel (ops.conv_step) instead of
# eight (sixteen) PyTorch launches; read at prefill(cuda_graph=True), when the graphs are
# captured. On since session 22 (H100, examples/generate_hyena.py --layer --cuda-graph): the median
# token 0.142 -> 0.054 ms and L = 8192 tokens 1.12 -> 0.57 s at B=16 C=4096, 0.052 -> 0.038 ms at
# B=1 C=256; the kernel alone replays in 4.9 us against the ops' 13.9 (B=1 C=256).
FUSED_STEP = True
# An FFT level's block runs in chunks of batch rows whose spectrum stays within this (`_batch_chunks`).
BLOCK_CHUNK_BYTES = 1 << 29
# The graphed steps' middle levels (DIRECT_MAX_BLOCK < n <= KERNEL_MAX_BLOCK) as one direct
# Toeplitz-product kernel (ops.conv_block) instead of two FFTs on 2n points and six more launches
# (where FUSED_STEP's kernel runs; on the CPU the op's PyTorch form); read at prefill(cuda_graph=True).
# These levels set the p99 token (level 6 at T = 8192). On since session 24 (H100, B=16 C=4096
# L=8192, examples/generate_hyena.py --layer --cuda-graph): p99 token 0.241 -> 0.084 ms (median
# 0.039 -> 0.033), the L = 8192 tokens 0.452 -> 0.361 s (predicted p99 0.05-0.08, total ~0.36).
MID_LEVELS_IN_KERNEL = True
KERNEL_MAX_BLOCK = 256  # kConvBlockMaxBlock (fftconv.h)
# A graphed state's tokens whose fold the step kernel does alone (no fold, level 0 and the
# Toeplitz levels: 15 tokens in 16) as one direct launch of that kernel (ops.conv_step_at: the
# position from the host, x_t read where it lies, the device index left at i + 1 for the graphs
# of the other levels) instead of a copy of x_t and a replay (a copy kernel, the step kernel and
# the index increment: three kernels a token). Where x_t is not in the compute dtype the replay
# stays (its copy casts). On the CPU (the tests' stand-in graphs) the op's PyTorch form. On since
# session 25 (H100, examples/generate_hyena.py --layer --cuda-graph --[no-]direct-step, back to
# back): B16 C1024 L65536 streamed 2.11 -> 1.73 s, synchronised 3.23 -> 2.80 s (predicted ~1.0 s
# streamed: the host's Python and dispatch, not the kernels, set a token's time); B16 C4096 L8192
# 0.299 -> 0.212 s streamed; B1 C256 L8192 0.187 -> 0.177 s streamed.
DIRECT_STEP = True
# With DIRECT_STEP, an FFTConv's direct tokens through the extension's DirectStepper (a C++ object
# made at prefill with the state's tensors: a token's checks, level and launch in one Python call,
# y_t the view outputs[i]) instead of the Python step and the conv_step_at op, whose dispatch cost
# 9 of a token's 18.5 us of host time (session 25). Read at prefill(cuda_graph=True) and each step.
# On since session 26 (H100, examples/generate_hyena.py --layer --cuda-graph --[no-]direct-stepper,
# back to back): B16 C1024 L65536 streamed 1.267 -> 0.709 s (70x naive streamed; 18.5 -> 9.75 us of
# host time a direct token), p99 token 0.116 -> 0.057 ms; B16 C4096 L8192 0.189 -> 0.156 s, p99
# 0.194 -> 0.080. It also takes the middle levels' tokens: the step kernel and conv_block at the
# host's position, without the copy of x_t or the level's graph (session 27, H100, B16 C1024
# L65536: a middle token 0.051-0.059 -> 0.038-0.043 ms against the graphs launched from C++, p99
# 0.088 -> 0.071-0.074).
DIRECT_STEPPER = True
_DIRECT_STEPPER_ABI = 3  # binding.cpp's DIRECT_STEPPER_ABI: the DirectStepper signatures called below
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


# --------------------------------------------------------------------------- the filter's watch

@dataclass(eq=False)  # hashed by identity: the optimizer hook's WeakSet holds watches
class _Watch:
    """What a state was derived from, as it was at prefill: each tensor (the same object), where
    its values lie (address, dtype, shape, strides, device: a `.data` assignment, a dtype
    conversion or `torch.utils.swap_tensors` moves them), its version counter (in-place writes
    through autograd bump it), whether a torch.optim optimizer has stepped it since (fused
    steps bump no counter: a step hook tells), and the modules' plain settings (numbers, flags
    and names such as a filter's modulation shift). A cheap host check a token. Writes that move
    nothing, bump no counter and are no optimizer's step pass unseen: in-place writes through
    `.data`, in-place writes to inference tensors (which keep no counter)."""

    tensors: tuple[Tensor, ...]
    placements: tuple[tuple[Any, ...], ...]
    versions: tuple[int | None, ...]
    settings: tuple[tuple[dict, str, Any], ...] = ()
    stepped: bool = False  # set by _after_optimizer_step

    @classmethod
    def of(cls, tensors: Iterable[Tensor], modules: Iterable[torch.nn.Module] = ()) -> _Watch:
        tensors = tuple(tensors)
        watch = cls(tensors, tuple(_placement(t) for t in tensors), tuple(_version(t) for t in tensors),
                    _settings(modules))
        _watch_optimizer_steps(watch)
        return watch

    def check(self, tensors: Iterable[Tensor], what: str) -> None:
        # Once a token: a plain loop (generators and a tuple of versions cost ~2 us a call). The
        # same tensor object keeps its inference-ness, so a None version needs no new check.
        now = tuple(tensors)
        if len(now) != len(self.tensors):
            raise _replaced(what)
        modified = False
        for t, kept, placement, version in zip(now, self.tensors, self.placements, self.versions):
            if t is not kept or _placement(t) != placement:
                raise _replaced(what)
            modified |= version is not None and t._version != version
        if self.stepped:  # first: the likelier cause of a version change too
            raise RuntimeError(f"an optimizer stepped {what} since prefill; step uses the parameters as they were "
                               "at prefill (like a KV cache): call prefill again")
        if modified:
            raise RuntimeError(f"{what} was modified in place since prefill; step uses the parameters as they "
                               "were at prefill (like a KV cache): call prefill again")
        if any(attributes.get(name, _MISSING) != value for attributes, name, value in self.settings):
            raise RuntimeError("a plain attribute of the operator's modules (such as a filter's shift) changed since "
                               "prefill; step uses the operator as it was at prefill: call prefill again")


# Every live watch, for the optimizer step hook; the hook is registered at the first prefill (not
# at import) and costs an optimizer step nothing while no state is alive.
_WATCHES: weakref.WeakSet[_Watch] = weakref.WeakSet()
_optimizer_hook: Any = None


def _watch_optimizer_steps(watch: _Watch) -> None:
    global _optimizer_hook
    if _optimizer_hook is None:
        _optimizer_hook = register_optimizer_step_post_hook(_after_optimizer_step)
    _WATCHES.add(watch)


def _after_optimizer_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Marks the watches over a parameter this step updated (one with a gradient: the others
    are skipped by every torch.optim step)."""
    if not _WATCHES:
        return
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"] if p.grad is not None}
    for watch in list(_WATCHES):
        if not watch.stepped and any(id(t) in stepped for t in watch.tensors):
            watch.stepped = True


def _replaced(what: str) -> RuntimeError:
    return RuntimeError(f"{what} was replaced since prefill; step uses the parameters as they were at "
                        "prefill (like a KV cache): call prefill again")


def _version(t: Tensor) -> int | None:
    return None if t.is_inference() else t._version


def _placement(t: Tensor) -> tuple[Any, ...]:
    return (t.data_ptr(), t.dtype, t.shape, t.stride(), t.device)


_MISSING = object()


def _settings(modules: Iterable[torch.nn.Module]) -> tuple[tuple[dict, str, Any], ...]:
    """Each module's plain attributes as (its attribute dict, name, value at prefill): a token's
    check reads the dicts kept here, without walking the modules (not `training`: generation
    runs the inference form)."""
    return tuple((vars(m), name, value) for m in modules for name, value in vars(m).items()
                 if name != "training" and not name.startswith("_")
                 and (value is None or isinstance(value, (bool, int, float, str))))


# --------------------------------------------------------------------------- one convolution stream

@dataclass
class ConvState:
    """What the future positions of a batch of streams need, for one causal convolution.

    Generated index i = position − prompt_len. `pending[..., i]` holds, once position i is
    reached, Σ_{s < position} k[position − s]·x[s]; step adds k[0]·x[position]. Every tensor is
    allocated at prefill, in the compute dtype (fp32; fp64 for fp64 inputs)."""

    max_len: int
    prompt_len: int
    position: int              # the next position to generate (host state: the schedule reads it)
    batch: int
    channels: int
    groups: int
    dtype: torch.dtype         # the inputs' and outputs' dtype
    device: torch.device
    first_tap: Tensor          # (C,): k[c // (C // G), 0], the current input's own weight
    second_tap: Tensor         # (C,): k[c // (C // G), 1] (0 for a one-tap filter): level 0's block
    toeplitz: list[Tensor]     # level q with n = 2^q <= DIRECT_MAX_BLOCK: (G, n, n), [j, m] = k[n + m - j]
    spectra: list[Tensor]      # the larger levels: rfft(k[:, :2n], 2n) / 2n, (G, n + 1) complex
    middle_taps: Tensor | None  # (G, 2n): k[:, :2n], n the largest middle level's (ops.conv_block), or None
    inputs: Tensor             # (B, C, T): the generated inputs, T = max_len - prompt_len
    pending: Tensor            # (B, C, T + tail): each generated position's sum over the inputs folded in so far
    watch: _Watch | None = field(default=None, repr=False)
    graphed: _GraphedSteps | None = field(default=None, repr=False)  # prefill(..., cuda_graph=True)
    direct: Any = field(default=None, repr=False)  # FFTConv.prefill(cuda_graph=True): its DirectStepper, or None

    @property
    def nbytes(self) -> int:
        """The state's memory: buffers, filter blocks and spectra (and a graphed state's own
        buffers and the memory its graphs' pool reserved)."""
        tensors = [self.first_tap, self.second_tap, self.inputs, self.pending, *self.toeplitz, *self.spectra]
        tensors += [] if self.middle_taps is None else [self.middle_taps]
        return _bytes(tensors) + _graphed_bytes(self.graphed)


def prefill(x: Tensor, k: Tensor, max_len: int, *, precision: str | None = None,
            cuda_graph: bool = False) -> tuple[Tensor, ConvState]:
    """y = fftconv(x, k) over the prompt x (B, C, P), 0 <= P <= max_len, and the state for
    generating positions P .. max_len - 1 with `step`. k: (G, Lk), C % G == 0, Lk <= max_len
    (a shorter filter is zero past Lk). `precision` is that of the two prefill `fftconv` calls;
    steps compute in fp32 (fp64 for fp64 inputs). The state derives from k as it is now.
    cuda_graph (CUDA only): capture each block level's step as a CUDA graph here, so that a
    step is one copy and one graph launch (`_GraphedSteps`; its y_t a view of the state's
    output history), or, for the 15 tokens in 16 that fold no larger level, one launch of the
    step kernel (DIRECT_STEP; its y_t the kernel's own, also in the history)."""
    state = start(x, k, max_len, precision=precision, cuda_graph=cuda_graph)
    length = x.shape[-1]
    if length == 0:
        return x.new_empty(x.shape), state
    return fftconv(x, k[..., :length], precision=precision), state


def start(x: Tensor, k: Tensor, max_len: int, *, precision: str | None = None,
          cuda_graph: bool = False) -> ConvState:
    """The state after the prompt x (B, C, P), without the prompt's output (`prefill` computes it)."""
    if precision is not None:
        policy.check_precision(precision)  # an empty prompt makes no call that would check it
    _check_prefill(x, k, max_len)
    _check_cuda_graph(cuda_graph, x)
    with torch.no_grad():
        state, filt = _allocate(x, k, max_len)
        if cuda_graph and state.inputs.shape[-1]:
            state.graphed = _GraphedSteps.capture(state)  # before the prompt's sums: its warm-up writes the buffers
        _add_prompt(state, x, filt, precision)
        return state


def _allocate(x: Tensor, k: Tensor, max_len: int) -> tuple[ConvState, Tensor]:
    """A state for the prompt x with zero buffers (the prompt's sums not yet in `pending`), and
    the filter in the compute dtype."""
    batch, channels, prompt_len = x.shape
    dtype = compute_dtype(x, k)
    filt = k.to(dtype)
    to_generate = max_len - prompt_len
    toeplitz, spectra = _filter_blocks(filt, to_generate)
    # (2, C): k[:, 0] and k[:, 1] (zero for a one-tap filter) per channel, each row contiguous
    first_taps = F.pad(filt[:, :2], (0, 2 - min(filt.shape[-1], 2))).repeat_interleave(channels // k.shape[0], 0)
    first_taps = first_taps.T.contiguous()
    inputs = x.new_zeros(batch, channels, to_generate, dtype=dtype)
    pending = x.new_zeros(batch, channels, _pending_length(to_generate), dtype=dtype)
    state = ConvState(
        max_len=max_len, prompt_len=prompt_len, position=prompt_len, batch=batch, channels=channels,
        groups=k.shape[0], dtype=x.dtype, device=x.device,
        first_tap=first_taps[0], second_tap=first_taps[1],
        toeplitz=toeplitz, spectra=spectra, middle_taps=_middle_taps(filt, to_generate), inputs=inputs,
        pending=pending)
    return state, filt


def _add_prompt(state: ConvState, x: Tensor, filt: Tensor, precision: str | None) -> None:
    """The prompt's sums for every generated position, into `pending`."""
    to_generate = state.inputs.shape[-1]
    if state.prompt_len and to_generate:
        state.pending[..., :to_generate] = _prompt_contribution(x.to(filt.dtype), filt, state.max_len, precision)


def step(x_t: Tensor, state: ConvState) -> tuple[Tensor, ConvState]:
    """y_t (B, C) for the input x_t (B, C) at the state's next position; advances the state in
    place (and returns it). Records no gradient."""
    _check_step(x_t, state)
    if state.graphed is not None:
        return state.graphed.step(x_t, state), state
    i = state.position - state.prompt_len
    with torch.no_grad():
        x = x_t if x_t.dtype == state.inputs.dtype else x_t.to(state.inputs.dtype)
        state.inputs[..., i] = x
        y = torch.addcmul(state.pending[..., i], state.first_tap, x)
        _fold_block(state, i)
    state.position += 1
    return (y if y.dtype == x_t.dtype else y.to(x_t.dtype)), state


def _prompt_contribution(x: Tensor, k: Tensor, max_len: int, precision: str | None) -> Tensor:
    """Σ_{s<P} k[t-s]·x[s] for t = P .. max_len - 1: one fftconv of the zero-padded prompt."""
    prompt_len = x.shape[-1]
    padded = F.pad(x, (0, max_len - prompt_len))
    return fftconv(padded, k, precision=precision)[..., prompt_len:]


def _levels(to_generate: int) -> range:
    """The block levels q that fold: n = 2^q divides some i + 1 with i + 1 < T."""
    return range(max(to_generate - 1, 0).bit_length())


def _pending_length(to_generate: int) -> int:
    """T plus the tail the last blocks write past the end (outputs never read, but a fixed
    slice per level keeps every step's shapes fixed). The last fold of level n is at the largest
    odd multiple m of n below T; it writes up to m + n."""
    end = to_generate
    for q in _levels(to_generate):
        n = 1 << q
        multiple = (to_generate - 1) // n
        end = max(end, n * (multiple if multiple % 2 else multiple - 1) + n)
    return end


def _filter_blocks(k: Tensor, to_generate: int) -> tuple[list[Tensor], list[Tensor]]:
    """Per level, the taps k[:, 0 .. 2n-1] (zero past the filter) as a Toeplitz block (small n)
    or a spectrum on 2n points with the inverse's 1/(2n) folded in (the larger n)."""
    toeplitz, spectra = [], []
    for q in _levels(to_generate):
        n = 1 << q
        taps = F.pad(k[:, : 2 * n], (0, max(0, 2 * n - k.shape[-1])))
        if n <= DIRECT_MAX_BLOCK:
            lags = n + torch.arange(n, device=k.device) - torch.arange(n, device=k.device)[:, None]  # [j, m] = n+m-j
            toeplitz.append(taps[:, lags].contiguous())
        else:
            spectra.append(torch.fft.rfft(taps, n=2 * n, norm="forward"))
    return toeplitz, spectra


def _middle_levels(to_generate: int) -> list[int]:
    """The fold levels whose block ops.conv_block can take: DIRECT_MAX_BLOCK < n <= KERNEL_MAX_BLOCK."""
    return [q for q in _levels(to_generate) if DIRECT_MAX_BLOCK < (1 << q) <= KERNEL_MAX_BLOCK]


def _middle_taps(k: Tensor, to_generate: int) -> Tensor | None:
    """k[:, :2n] (zero past the filter), n the largest middle level's block: every middle level's
    taps (a level of n' reads the first 2n'), or None without a middle level."""
    middle = _middle_levels(to_generate)
    if not middle:
        return None
    width = 2 << middle[-1]
    return F.pad(k[:, :width], (0, max(0, width - k.shape[-1]))).contiguous()


def _fold_level(i: int, to_generate: int) -> int | None:
    """The level q of the block folded after generated step i (n = 2^q, the largest power of
    two dividing i + 1), or None when no position is left to receive it."""
    if i + 1 >= to_generate:
        return None
    return ((i + 1) & -(i + 1)).bit_length() - 1


def _fold_block(state: ConvState, i: int) -> None:
    """After generated step i: the last n inputs' contribution to the next n positions."""
    q = _fold_level(i, state.inputs.shape[-1])
    if q is None:
        return
    if q == 0:
        # Half of all folds: the last input times k[1] into the next position, one op (the
        # 1 x 1 Toeplitz product and its add took five: a third of a step's time on the CPU).
        state.pending[..., i + 1].addcmul_(state.inputs[..., i], state.second_tap)
        return
    n = 1 << q
    for rows in _batch_chunks(state, q):
        state.pending[rows, :, i + 1: i + 1 + n] += _block_contribution(state, q, state.inputs[rows, :, i + 1 - n: i + 1])


def _batch_chunks(state: ConvState, q: int) -> list[slice]:
    """The slices of batch rows level q's block runs in. An FFT level's temporaries (the block's
    spectrum, the product, the inverse) are a few times B·C·2n words at once: at B = 16,
    C = 1024, n = 32768 about 13 GB, inside the graphs' pool, and an H100 ran out of memory
    there (session 22). So each chunk's spectrum stays within BLOCK_CHUNK_BYTES (one row at
    least); the rows are independent, so chunks give each row the same arithmetic."""
    if q < len(state.toeplitz):
        return [slice(None)]
    spectrum_row_bytes = state.channels * ((1 << q) + 1) * 2 * state.inputs.element_size()
    rows = max(1, BLOCK_CHUNK_BYTES // spectrum_row_bytes)
    return [slice(b, min(b + rows, state.batch)) for b in range(0, state.batch, rows)]


def _block_contribution(state: ConvState, q: int, block: Tensor) -> Tensor:
    """The contribution (B, C, n) of the last n = 2^q inputs, block (B, C, n), to the next n
    positions: a Toeplitz product (small n) or a convolution of two FFTs on 2n points."""
    n = 1 << q
    grouped = _by_group(block, state.groups)  # (B, G, C/G, n)
    if q < len(state.toeplitz):
        out = grouped @ state.toeplitz[q]
    else:
        spectrum = state.spectra[q - len(state.toeplitz)].unsqueeze(1)  # (G, 1, n + 1)
        product = torch.fft.rfft(grouped, n=2 * n) * spectrum
        out = torch.fft.irfft(product, n=2 * n, norm="forward")[..., n:]
    return out.flatten(1, 2)


# --------------------------------------------------------------------------- CUDA graphs

@dataclass
class _GraphedSteps:
    """A ConvState's steps as CUDA graphs: the eager step launches 3–9 small kernels from Python
    a token (launch-bound on a GPU: 0.136 ms a token on an H100 at B = 1, C = 256, session 16),
    while a replay is one launch. What a step does depends on the position only through the
    offsets into `inputs`/`pending` and the fold level q, so the offsets live in a device
    tensor (`index`, the generated index i, advanced inside the graph) and each level has its
    own graph: the levels of T = max_len - prompt_len, and None (the last step, no fold). The
    input x_t is copied into `x`; y_t lands in `outputs[i]` and step returns that view (each
    position has its own row: a later step never overwrites it; for a 2-byte x_t, step returns
    its cast). The same indexed step runs eagerly, without capture, in the CPU tests
    (`indexed_step`).

    The graphs hold the state's buffers by address: a graphed state cannot be copied or forked.
    Their FFT levels run PyTorch's cached cuFFT plans, which the graphs do not own: step refuses
    to replay once the plan cache has been cleared or has filled up since the capture
    (`_PlanWatch`), rather than replay a freed plan."""

    x: Tensor                       # (B, C), the compute dtype: the input the graphs read
    index: Tensor                   # () int64: the generated index i the graphs read and advance
    outputs: Tensor | None          # (T, B, C): y of every generated position, the compute dtype (None: not kept)
    behind: dict[int, Tensor]       # level q >= 1: arange(1 - n, 1), the block's inputs relative to i
    ahead: dict[int, Tensor]        # level q >= 1: arange(1, n + 1), the positions it folds into
    graphs: dict[int | None, torch.cuda.CUDAGraph]
    pool_bytes: int = 0             # the graphs' private memory pool, as the allocator reserved it
    plans: _PlanWatch | None = None  # the cuFFT plans the graphs replay (None: no FFT level)
    step_kernel: bool = False       # DIRECT_STEP can run: the step kernel is there (or the CPU's form)
    kernel_levels: set[int] = field(default_factory=set)  # middle levels captured on ops.conv_block (no cuFFT)

    def tensors(self) -> list[Tensor]:
        kept = [] if self.outputs is None else [self.outputs]
        return [self.x, self.index, *kept, *self.behind.values(), *self.ahead.values()]

    @classmethod
    def indexed(cls, state: ConvState, history: bool = True) -> _GraphedSteps:
        """The buffers of the indexed step, without graphs (the graphs' capture, and tests);
        history=False keeps no output history (a caller that takes y from indexed_step)."""
        to_generate = state.inputs.shape[-1]
        like = state.inputs
        block_levels = [q for q in _levels(to_generate) if q >= 1]
        return cls(x=like.new_zeros(state.batch, state.channels),
                   index=torch.zeros((), dtype=torch.int64, device=like.device),
                   outputs=like.new_zeros(to_generate, state.batch, state.channels) if history else None,
                   behind={q: torch.arange(1 - (1 << q), 1, device=like.device) for q in block_levels},
                   ahead={q: torch.arange(1, (1 << q) + 1, device=like.device) for q in block_levels},
                   graphs={})

    @classmethod
    def capture(cls, state: ConvState) -> _GraphedSteps:
        """One graph per level, captured on the state's own buffers (`_capture_levels`)."""
        graphed = cls.indexed(state)
        assert graphed.outputs is not None  # step returns its rows
        buffers = [state.inputs, state.pending, graphed.x, graphed.index, graphed.outputs]
        graphed.graphs, graphed.pool_bytes, graphed.plans = _capture_levels(
            state.device, state.inputs.shape[-1], bool(state.spectra), buffers,
            lambda q: graphed.index.fill_(_warm_index(q, state.inputs.shape[-1])),
            lambda q: graphed.indexed_step(state, q))
        # (an older prebuilt extension may have conv_step without conv_step_at)
        graphed.step_kernel = not state.inputs.is_cuda or (
            _fused_step(state.device)
            and torch._C._dispatch_has_kernel_for_dispatch_key("monarch_fftconv::conv_step_at", "CUDA"))
        return graphed

    def indexed_step(self, state: ConvState, q: int | None) -> Tensor:
        """One step at the generated index `self.index` (a device tensor), folding level q:
        `step`'s arithmetic with every offset a device index. Advances `self.index`; returns
        y_t (B, C) in the compute dtype (also in `outputs`)."""
        at = self.index.view(1)
        fused = _fused_step(state.device)
        # fused, a Toeplitz level's block (q = 1 .. 3) goes into the same kernel
        block = _toeplitz_block(state, q) if fused else None
        block_in_kernel = block is not None
        step_at = ops.conv_step_op if fused else ops.conv_step_reference
        y = step_at(self.x, state.inputs, state.pending, self.outputs, state.first_tap, state.second_tap, self.index,
                    q == 0, block)
        # the middle levels by the kernel where it runs; the op's PyTorch form stands in on the CPU
        # (the tests' stand-in graphs), never on a GPU, where it would gather a (G, n, n) Toeplitz
        if MID_LEVELS_IN_KERNEL and q in _middle_levels(state.inputs.shape[-1]) and (fused or not state.inputs.is_cuda):
            block_at = ops.conv_block_op if fused else ops.conv_block_reference
            block_at(state.inputs, state.pending, state.middle_taps, self.index, 1 << q)
            if fused:
                self.kernel_levels.add(q)
        elif q is not None and q > 0 and not block_in_kernel:
            sources, targets = at + self.behind[q], at + self.ahead[q]  # i + 1 - n .. i; i + 1 .. i + n
            for rows in _batch_chunks(state, q):
                pending = state.pending[rows]  # a view: index_copy_ writes the state's buffer
                out = _block_contribution(state, q, state.inputs[rows].index_select(2, sources))
                pending.index_copy_(2, targets, pending.index_select(2, targets) + out)
        self.index.add_(1)
        return y

    def step(self, x_t: Tensor, state: ConvState) -> Tensor:
        """`step` by replaying the graph of this position's level (y_t a view of outputs[i]), or
        (DIRECT_STEP) by one launch of the step kernel where it does the level alone (y_t the
        kernel's own y, which it also writes to outputs[i]). Once a token: kept lean (each
        attribute, call and index here costs ~0.2-1 us of a token's ~18 us of host time)."""
        i = state.position - state.prompt_len  # `index` holds i too: every step of this state advances it
        to_generate = len(self.outputs)  # (T, B, C)
        q = _fold_level(i, to_generate)
        if DIRECT_STEP and self.step_kernel and (q is None or q < len(state.toeplitz)) and x_t.dtype == self.x.dtype:
            args = (x_t, state.inputs, state.pending, self.outputs, state.first_tap, state.second_tap, self.index, i,
                    q == 0, _toeplitz_block(state, q))
            if torch.is_grad_enabled():  # the op has no autograd kernel; entering no_grad costs ~2 us a token
                with torch.no_grad():
                    y = ops.conv_step_at_op(*args)
            else:
                y = ops.conv_step_at_op(*args)
            state.position += 1
            return y  # x_t is in the compute dtype here
        _replay(self, x_t, i, to_generate)
        state.position += 1
        y = self.outputs[i]
        return y if y.dtype == x_t.dtype else y.to(x_t.dtype)


def _toeplitz_block(state: ConvState, q: int | None) -> Tensor | None:
    """The (G, n, n) taps of level q's block where the step kernel can fold it (the Toeplitz
    levels q = 1 .. 3; level 0 is its `fold` flag), else None."""
    return state.toeplitz[q] if q is not None and 0 < q < len(state.toeplitz) else None


def _fused_step(device: torch.device) -> bool:
    """Whether a graphed step's per-token part runs as the one CUDA kernel (FUSED_STEP, on a
    CUDA device where the extension loads). Loads it first: until session 20 this asked only
    whether the kernel was registered, and a prefill whose prompt makes no CUDA call (an empty
    one) captured the PyTorch ops with FUSED_STEP on."""
    if not (FUSED_STEP and device.type == "cuda") or isinstance(_extension.coverage(True), str):
        return False
    return torch._C._dispatch_has_kernel_for_dispatch_key("monarch_fftconv::conv_step", "CUDA")


def _warm_index(q: int | None, to_generate: int) -> int:
    """A generated index whose fold is level q: i + 1 = 2^q (None: the last index)."""
    return to_generate - 1 if q is None else (1 << q) - 1


def _capture_levels(device: torch.device, to_generate: int, has_fft: bool, buffers: list[Tensor],
                    warm: Callable[[int | None], object], run: Callable[[int | None], object]
                    ) -> tuple[dict[int | None, torch.cuda.CUDAGraph], int, _PlanWatch | None]:
    """A graph of `run(q)` for each fold level q of T = to_generate steps and None (the last
    step), captured on the buffers `run` writes. Each level first runs once on a side stream
    after `warm(q)` (cuFFT plans, cuBLAS handles: made outside the capture, as torch.cuda.graph
    asks); that warm-up writes the buffers, so they are cleared after, before the prompt's sums
    go in. Returns the graphs, the memory their pool reserved, and the watch on the cuFFT plans
    they replay (None without FFT levels)."""
    with torch.cuda.device(device):
        plans = torch.backends.cuda.cufft_plan_cache[device.index]
        if has_fft and plans.max_size == 0:
            raise RuntimeError("cuda_graph=True needs PyTorch's cuFFT plan cache (its max_size is 0): the graphs "
                               "replay the cached plans")
        deterministic = torch.are_deterministic_algorithms_enabled()
        warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        # Deterministic mode sends index_copy_ through a path that reads an index on the host,
        # which a capture forbids; every index here is written once, so the op is deterministic.
        torch.use_deterministic_algorithms(False)
        try:
            levels: list[int | None] = [*_levels(to_generate), None]
            side = torch.cuda.Stream(device=device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for q in levels:
                    warm(q)
                    run(q)
            torch.cuda.current_stream(device).wait_stream(side)
            # One pool for these graphs: they run one at a time on one stream, and no tensor made
            # inside a capture outlives its graph, so their scratch can share.
            pool = torch.cuda.graph_pool_handle()
            reserved = torch.cuda.memory_reserved(device)
            graphs = {}
            for q in levels:
                graph = torch.cuda.CUDAGraph()
                # on `side`, a stream of this device (the default capture stream belongs to
                # whichever device was current at its first use)
                with torch.cuda.graph(graph, pool=pool, stream=side, capture_error_mode="thread_local"):
                    run(q)
                graphs[q] = graph
            pool_bytes = max(torch.cuda.memory_reserved(device) - reserved, 0)
        finally:
            torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        for t in buffers:
            t.zero_()
        return graphs, pool_bytes, (_PlanWatch(plans, plans.size) if has_fft else None)


def _replay(graphed: _GraphedSteps | _GraphedHyena, x_t: Tensor, i: int, to_generate: int) -> None:
    """x_t into the graphs' input, then the graph of generated step i's fold level. No device
    context (3.4 us of a token's ~20 us of host time, H100): copy_ runs on its tensors' device and
    CUDAGraph.replay sets its capture's device, each on that device's current stream."""
    q = _fold_level(i, to_generate)
    # A middle level on conv_block replays no cuFFT plan (as the C++ stepper knows: both agree)
    if graphed.plans is not None and q not in getattr(graphed, "kernel_levels", ()):
        graphed.plans.check()
    with torch.no_grad():
        graphed.x.copy_(x_t)
    graphed.graphs[q].replay()


def _graphed_bytes(graphed: _GraphedSteps | _GraphedHyena | None) -> int:
    """A graphed state's own buffers and the memory its graphs' pool reserved (0: not graphed)."""
    return 0 if graphed is None else _bytes(graphed.tensors()) + graphed.pool_bytes


def _bytes(tensors: Iterable[Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class _PlanWatch:
    """The device's cuFFT plan cache (PyTorch's accessor: each read asks the cache itself) and its
    size after a capture: the plans the graphs replay are still cached while the cache neither
    shrank below that size (a clear) nor reached its max_size (where it evicts)."""

    cache: Any
    size_at_capture: int

    def check(self) -> None:
        size = self.cache.size
        if size < self.size_at_capture or size >= self.cache.max_size:
            raise RuntimeError("the cuFFT plan cache was cleared or filled up since prefill(cuda_graph=True), so "
                               "the plans the graphs replay may be freed: prefill again")


def _check_cuda_graph(cuda_graph: object, x: Tensor) -> None:
    if not isinstance(cuda_graph, bool):
        raise TypeError(f"cuda_graph must be a bool, got {cuda_graph!r}")
    if cuda_graph and x.device.type != "cuda":
        raise ValueError(f"cuda_graph=True captures CUDA graphs: the prompt is on {x.device}")


def _by_group(t: Tensor, groups: int) -> Tensor:
    """(B, C, n) viewed as (B, G, C/G, n): channel c in group c // (C // G)."""
    return t.unflatten(1, (groups, t.shape[1] // groups))


def _check_prefill(x: object, k: object, max_len: object) -> None:
    for name, t in (("x", x), ("k", k)):
        if not isinstance(t, Tensor) or t.dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{name} must be a real floating-point tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    assert isinstance(x, Tensor) and isinstance(k, Tensor)
    _check_max_len(max_len)
    if x.dim() != 3:
        raise ValueError(f"the prompt must have shape (B, C, P), got {tuple(x.shape)}")
    if k.dim() == 3:
        raise ValueError("bidirectional filters read future inputs: they cannot be generated causally")
    if k.dim() != 2 or k.shape[-1] == 0 or k.shape[0] == 0:
        raise ValueError(f"the filter must have shape (G, Lk), got {tuple(k.shape)}")
    batch, channels, prompt_len = x.shape
    if channels == 0 or channels % k.shape[0]:
        raise ValueError(f"channel mismatch: the prompt has {channels} channels, the filter {k.shape[0]} rows "
                         "(G filters serve C channels when C % G == 0)")
    if prompt_len > max_len:
        raise ValueError(f"the prompt ({prompt_len} positions) is longer than max_len={max_len}")
    if k.shape[-1] > max_len:
        raise ValueError(f"the filter ({k.shape[-1]} taps) is longer than max_len={max_len}")
    if k.device != x.device:
        raise ValueError(f"the prompt and the filter are on different devices: {x.device} and {k.device}")


def _check_max_len(max_len: object, longest: int | None = None) -> None:
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be a positive int, got {max_len!r}")
    if longest is not None and max_len > longest:
        raise ValueError(f"max_len={max_len} exceeds the layer's longest sequence, {longest}")


def _check_step(x_t: object, state: ConvState) -> None:
    if not isinstance(x_t, Tensor):
        raise TypeError(f"x_t must be a torch.Tensor, got {type(x_t).__name__}")
    _check_room(state.position, state.max_len)
    if tuple(x_t.shape) != (state.batch, state.channels):
        raise ValueError(f"x_t must have shape (B, C) = ({state.batch}, {state.channels}) as at prefill, "
                         f"got {tuple(x_t.shape)}")
    _check_like_prefill(x_t, state.dtype, state.device, state.inputs)


def _check_room(position: int, max_len: int) -> None:
    if position >= max_len:
        raise RuntimeError(f"the stream is full: all max_len={max_len} positions were generated; "
                           "prefill again with a larger max_len")


def _check_like_prefill(x_t: Tensor, dtype: torch.dtype, device: torch.device, buffer: Tensor) -> None:
    """x_t in the prefill's dtype and device, stepped in the mode `buffer` (a state tensor) was made in."""
    if x_t.dtype != dtype or x_t.device != device:
        raise ValueError(f"x_t must be {dtype} on {device} as at prefill, got {x_t.dtype} on {x_t.device}")
    if buffer.is_inference() and not torch.is_inference_mode_enabled():
        raise RuntimeError("this state was made under torch.inference_mode(): step it there too")


# --------------------------------------------------------------------------- FFTConv

def prefill_fftconv(layer: FFTConv, x: Tensor, max_len: int, cuda_graph: bool = False) -> tuple[Tensor, ConvState]:
    """`FFTConv.prefill`: y = layer(x), the layer's ordinary call, and the state."""
    if layer.bidirectional:
        raise ValueError("FFTConv(bidirectional=True) reads future inputs: it cannot be generated causally")
    _check_max_len(max_len, layer.seq_len)
    if isinstance(x, Tensor) and x.dim() == 3 and x.shape[1] != layer.channels:
        raise ValueError(f"the prompt has {x.shape[1]} channels, the layer {layer.channels}")
    state = start(x, layer.filter[..., :max_len], max_len, precision=layer.precision, cuda_graph=cuda_graph)
    state.watch = _Watch.of(_filter_tensors(layer))
    state.direct = _direct_stepper(state, layer.filter)
    y = layer(x) if x.shape[-1] else x.new_empty(x.shape)
    return y, state


def _direct_stepper(state: ConvState, filt: Tensor) -> Any:
    """The extension's DirectStepper for a graphed CUDA state whose direct steps can run (the
    step kernel there, x_t in the compute dtype: the prefill's dtype is it), or None."""
    graphed = state.graphed
    if not (DIRECT_STEPPER and graphed is not None and graphed.step_kernel and state.inputs.is_cuda
            and graphed.outputs is not None and state.dtype == state.inputs.dtype):
        return None
    module = _extension.python_module()
    if getattr(module, "DIRECT_STEPPER_ABI", None) != _DIRECT_STEPPER_ABI:
        return None  # no module, or a build whose stepper takes other arguments
    # The middle levels (conv_block: no cuFFT plan to watch) are the stepper's too, their two
    # kernels launched directly. The FFT levels stay with _replay.
    middle = sorted(graphed.kernel_levels)
    return module.DirectStepper(state.inputs, state.pending, graphed.outputs, state.first_tap, state.second_tap,
                                graphed.index, state.toeplitz, state.prompt_len, filt,
                                state.middle_taps if middle else None, middle)


def _filter_tensors(layer: FFTConv) -> list[Tensor]:
    """The tensors an FFTConv's filter is: the parameter, or under `torch.nn.utils.parametrize`
    the originals it is computed from (each read of the filter computes a new tensor)."""
    parametrizations = getattr(layer, "parametrizations", None)
    if parametrizations is not None and "filter" in parametrizations:
        return [*parametrizations["filter"].parameters(), *parametrizations["filter"].buffers()]
    return [layer.filter]


def step_fftconv(layer: FFTConv, x_t: Tensor, state: ConvState) -> tuple[Tensor, ConvState]:
    """`FFTConv.step`: `step`, once the layer's filter is checked to be the prefill's. A direct
    token goes to the state's DirectStepper first, which answers None for anything but the plain
    case (then this path takes it: its checks raise what they raise)."""
    direct = state.direct
    if direct is not None and DIRECT_STEP and DIRECT_STEPPER and not state.watch.stepped:
        y = direct.step(x_t, state.position, layer.filter)
        if y is not None:
            state.position += 1
            return y, state
    if state.watch is None:
        raise ValueError("this state was not made by FFTConv.prefill")
    state.watch.check(_filter_tensors(layer), "FFTConv.filter")
    return step(x_t, state)


# --------------------------------------------------------------------------- HyenaOperator

@dataclass
class HyenaState:
    """A HyenaOperator's generation state: the short filter's window and one ConvState per
    order step, with the operator's parameters as they were at prefill."""

    position: int
    max_len: int
    window: Tensor              # (B, W, ks): projected inputs, slot s % ks holds position s (W = (order+1)·d)
    window_weights: Tensor      # (ks, W, ks): the short filter's taps, rotated for each t % ks
    convs: list[ConvState]      # one per order step
    skips: Tensor | None        # (order - 1, d): each step's D, or None
    dtype: torch.dtype          # the prompt's: x_t's (under autocast the buffers are autocast's)
    watch: _Watch = field(repr=False)
    graphed: _GraphedHyena | None = field(default=None, repr=False)  # prefill(..., cuda_graph=True)

    @property
    def nbytes(self) -> int:
        own = [self.window, self.window_weights] + ([] if self.skips is None else [self.skips])
        return _bytes(own) + sum(c.nbytes for c in self.convs) + _graphed_bytes(self.graphed)


def prefill_hyena(op: HyenaOperator, x: Tensor, max_len: int, cuda_graph: bool = False) -> tuple[Tensor, HyenaState]:
    """`HyenaOperator.prefill`: the operator's output for the prompt x (B, P, d), computed as its
    forward computes it, and the state for positions P .. max_len - 1."""
    if op.bidirectional:
        raise ValueError("HyenaOperator(bidirectional=True) reads future inputs: it cannot be generated causally")
    _check_max_len(max_len, op.l_max)
    op._check_input(x, min_len=0)
    prompt_len = x.shape[1]
    if prompt_len > max_len:
        raise ValueError(f"the prompt ({prompt_len} positions) is longer than max_len={max_len}")
    raw = op.in_proj(x).transpose(1, 2)  # (B, W, P)
    # As forward: padded on both sides, the first P outputs causal (an empty prompt skips the conv).
    projected = op.short_filter(raw)[..., :prompt_len] if prompt_len else raw
    *gates, v = projected.split(op.d_model, dim=1)
    with torch.no_grad():
        k, skips = op.long_filters(max_len)
    k_prompt, skips_prompt = op.long_filters(prompt_len) if prompt_len else (None, None)
    _check_cuda_graph(cuda_graph, x)
    convs, prompts = [], []  # each long convolution's state, and its prompt with the filter
    for o, gate in enumerate(reversed(gates[1:])):
        u = v * gate
        _check_prefill(u, k[o], max_len)
        with torch.no_grad():
            conv, filt = _allocate(u, k[o], max_len)
        convs.append(conv)
        prompts.append((u, filt))
        if prompt_len:
            last = o == op.order - 2
            v = op.long_conv(v, k_prompt[o], None if skips_prompt is None else skips_prompt[o], gate,
                             gates[0] if last else None)
    y = op.out_proj(v.transpose(1, 2)) if prompt_len else x.new_empty(x.shape)
    with torch.no_grad():
        window, window_weights = _short_window(op, raw)
        state = HyenaState(position=prompt_len, max_len=max_len, window=torch.zeros_like(window),
                           window_weights=window_weights, convs=convs, skips=skips, dtype=x.dtype,
                           watch=_Watch.of(_hyena_tensors(op), op.modules()))
        if cuda_graph and max_len > prompt_len:
            state.graphed = _GraphedHyena.capture(op, state, x.dtype)  # its warm-up writes the buffers: first
        state.window.copy_(window)
        for conv, (u, filt) in zip(convs, prompts):
            _add_prompt(conv, u, filt, op.precision)
    return y, state


def step_hyena(op: HyenaOperator, x_t: Tensor, state: HyenaState) -> tuple[Tensor, HyenaState]:
    """`HyenaOperator.step`: x_t (B, d) -> y_t (B, d), as forward computes that position."""
    state.watch.check(_hyena_tensors(op), "a HyenaOperator parameter or buffer")
    _check_room(state.position, state.max_len)
    batch, _, taps = state.window.shape
    if not isinstance(x_t, Tensor) or tuple(x_t.shape) != (batch, op.d_model):
        raise ValueError(f"x_t must have shape (B, d_model) = ({batch}, {op.d_model}), got {getattr(x_t, 'shape', x_t)}")
    _check_like_prefill(x_t, state.dtype, state.window.device, state.window)
    if state.graphed is not None:
        return state.graphed.step(op, x_t, state), state
    with torch.no_grad():
        slot = state.position % taps
        state.window[..., slot] = op.in_proj(x_t)
        # In the window's dtype, as forward's short convolution returns it (autocast's, at times)
        projected = (state.window * state.window_weights[slot]).sum(-1).to(state.window.dtype)
        if op.short_filter.bias is not None:
            projected = projected + op.short_filter.bias.to(projected.dtype)
        *gates, v = projected.split(op.d_model, dim=1)
        for o, gate in enumerate(reversed(gates[1:])):
            u = v * gate
            v, _ = step(u, state.convs[o])
            if state.skips is not None:
                v = v + state.skips[o].to(v.dtype) * u
        v = v * gates[0]
        y = op.out_proj(v)
    state.position += 1
    return y, state


@dataclass
class _GraphedHyena:
    """A HyenaOperator's steps as CUDA graphs (`_GraphedSteps` for one convolution): its long
    convolutions share the position, so one graph per fold level replays the whole step, the
    projections, the short filter (its ring slot (P + i) % ks from the device index), the gates,
    every long convolution's indexed step and D. y_t lands in `outputs[i]`."""

    x: Tensor                       # (B, d): the input the graphs read, x_t's dtype
    index: Tensor                   # () int64: the generated index i
    outputs: Tensor                 # (T, B, d): y of every generated position, x_t's dtype
    convs: list[_GraphedSteps]      # each long convolution's indexed buffers (no graphs, no history of their own)
    prompt_len: int
    graphs: dict[int | None, torch.cuda.CUDAGraph]
    # The operator's parameters and buffers the graphs read by address, as at capture: held, so a
    # `.data` reassignment cannot free what a replay reads (the state's watch refuses the step)
    captured: tuple[Tensor, ...] = ()
    pool_bytes: int = 0
    plans: _PlanWatch | None = None

    def tensors(self) -> list[Tensor]:
        return [self.x, self.index, self.outputs, *(t for c in self.convs for t in c.tensors())]

    @classmethod
    def capture(cls, op: HyenaOperator, state: HyenaState, dtype: torch.dtype) -> _GraphedHyena:
        to_generate = state.max_len - state.position
        batch = state.window.shape[0]
        like = state.window
        graphed = cls(x=like.new_zeros(batch, op.d_model, dtype=dtype),
                      index=torch.zeros((), dtype=torch.int64, device=like.device),
                      outputs=like.new_zeros(to_generate, batch, op.d_model, dtype=dtype),
                      convs=[_GraphedSteps.indexed(c, history=False) for c in state.convs],
                      prompt_len=state.position, graphs={},
                      captured=tuple(t.detach() for t in _hyena_tensors(op)))
        buffers = [state.window, graphed.x, graphed.index, graphed.outputs]
        for conv, indexed in zip(state.convs, graphed.convs):
            buffers += [conv.inputs, conv.pending, indexed.x, indexed.index]

        def warm(q: int | None) -> None:
            i = _warm_index(q, to_generate)
            for t in (graphed.index, *(c.index for c in graphed.convs)):
                t.fill_(i)

        graphed.graphs, graphed.pool_bytes, graphed.plans = _capture_levels(
            like.device, to_generate, any(c.spectra for c in state.convs), buffers, warm,
            lambda q: graphed.indexed_step(op, state, q))
        return graphed

    def indexed_step(self, op: HyenaOperator, state: HyenaState, q: int | None) -> None:
        """`step_hyena` at the generated index `self.index`, folding level q in every long
        convolution; advances the indices."""
        taps = state.window.shape[-1]
        slot = torch.remainder(self.index + self.prompt_len, taps).view(1)
        state.window.index_copy_(2, slot, op.in_proj(self.x).unsqueeze(-1))
        weights = state.window_weights.index_select(0, slot).squeeze(0)
        projected = (state.window * weights).sum(-1).to(state.window.dtype)
        if op.short_filter.bias is not None:
            projected = projected + op.short_filter.bias.to(projected.dtype)
        *gates, v = projected.split(op.d_model, dim=1)
        for o, gate in enumerate(reversed(gates[1:])):
            u = v * gate
            conv = self.convs[o]
            conv.x.copy_(u)
            v = conv.indexed_step(state.convs[o], q).to(u.dtype)
            if state.skips is not None:
                v = v + state.skips[o].to(v.dtype) * u
        y = op.out_proj(v * gates[0])
        self.outputs.index_copy_(0, self.index.view(1), y.unsqueeze(0))
        self.index.add_(1)

    def step(self, op: HyenaOperator, x_t: Tensor, state: HyenaState) -> Tensor:
        """`step_hyena` by replaying the graph of this position's level: y_t, a view of outputs[i]."""
        # step_hyena's watch has refused a parameter whose values moved (the graphs read the old
        # addresses, which `captured` keeps alive)
        i = state.position - self.prompt_len
        _replay(self, x_t, i, self.outputs.shape[0])
        state.position += 1
        for conv in state.convs:
            conv.position += 1
        return self.outputs[i]


def _short_window(op: HyenaOperator, raw: Tensor) -> tuple[Tensor, Tensor]:
    """The ring of the last ks projected inputs (zeros before position 0, as the conv's padding)
    and the short filter's taps rotated per slot: at position t, tap j weighs position
    t + j - (ks - 1), held in slot (t + j - ks + 1) % ks."""
    weight = op.short_filter.weight[:, 0, :]  # (W, ks): a cross-correlation, tap ks-1 on the current input
    taps = weight.shape[-1]
    prompt_len = raw.shape[-1]
    window = raw.new_zeros(raw.shape[0], raw.shape[1], taps)
    for s in range(max(0, prompt_len - taps + 1), prompt_len):
        window[..., s % taps] = raw[..., s]
    rotated = weight.new_empty(taps, *weight.shape)
    for t in range(taps):
        slots = [(t + j - taps + 1) % taps for j in range(taps)]
        rotated[t][:, slots] = weight
    return window, rotated


def _hyena_tensors(op: HyenaOperator) -> list[Tensor]:
    return [*op.parameters(), *op.buffers()]
