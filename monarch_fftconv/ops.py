"""The ``monarch_fftconv::*`` torch ops: schemas, one implementation per device, fake
kernels and autograd.

The ops run the Monarch algorithm on whatever device their tensors live on; the dispatcher
picks the implementation by device. CPU: Python, the portable engine (the four-step spec of
fourstep.py for N >= 65536). CUDA: C++, the extension's kernels (csrc/binding.cpp),
registered when `_extension` loads it; no Python runs between the op call and the launches.

==========================================================  ===============  ==================================
op                                                          CPU              CUDA
==========================================================  ===============  ==================================
``filter_spectrum(k, seq_len, precision) -> S``             portable engine  one fp32 kernel (four-step: two)
``filter_spectrum_two_sided(k, seq_len, precision) -> S``   portable engine  the same kernel on k's two-sided
                                                                             circle (four-step: two, ATen add)
``refresh_filter_spectrum(k, source!, S!, seq_len, prec.)``  portable engine  the same kernel, changed rows only
``conv_forward(u, S, skip, precision) -> y``                portable engine  the fused kernel of the precision
                                                                             (four-step: three, fp32)
``gated_conv_forward(u, S, skip, pre, post, precision)``     portable engine  the fp32 kernel, gates fused
                                                                             (elsewhere: ATen gates around)
``fftconv(u, k, skip, precision) -> (y, S)``                the two above    the two above
``fftconv_backward(grad, u, S, skip, Lk, precision)``       portable engine  two fused fp32 kernels
                                                                             (four-step: eight)
``fftconv_backward_two_sided(...)``: dk (C, 2, Lk)          portable engine  the same two kernels
                                                                             (four-step: two backwards)
``fftconv_keeping_spectrum(u, k, skip, prec.) -> (y, S, X)``  the two above,  fftconv's launches, u's
                                                             X by fourstep    spectrum X stored by the
                                                                             inner kernel (four-step)
``fftconv_backward_from_spectrum(grad, u, X, S, ...)``      fourstep spec    fftconv_backward's, less X's
                                                                             two launches (four-step: six)
``conv_step(x, inputs!, pending!, outputs!, ...) -> y``     PyTorch ops      one kernel (a generation step,
                                                                             a small level's block too)
``conv_step_at(x, ..., index!, position, ...) -> y``        PyTorch ops      the conv_step kernel at a host
                                                                             position (a direct step)
``conv_block(inputs, pending!, taps, index, n)``             PyTorch ops      one kernel (a middle level's
                                                                             block, a direct product)
``gated_fftconv(u, k, skip, pre, post, prec.) -> (y, z, S)``  the ops above    the spectrum kernel, the fp32
                                                                             kernel with gates and z (else
                                                                             ATen gates around)
``gated_fftconv_backward(grad, u, S, skip, pre, post, ...)``  the ops above    the gated grad kernel and the
                                                                             filter-gradient kernel (fp32
                                                                             io, N <= 32768; else ATen gates
                                                                             around the backward)
==========================================================  ===============  ==================================

S is the filter spectrum, (C, n1/2+1, M, 2) real in the compute dtype, scaled by 1/N: the
Monarch layout of the plan for N <= 32768, the four-step layout (P/2+1 rows of M) above
(docs/design.md). ``fftconv`` returns it beside y so that its autograd saves it for the
backward instead of recomputing it; it is not differentiable.

Calls that no Monarch implementation covers (e.g. N > 2^23 on CUDA) never reach these
ops: `backends.select_backend` sends them to torch.fft before any op is called.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import fourstep, portable
from .planner import compute_dtype, plan_for


def _spectrum_shape(k: Tensor, seq_len: int) -> tuple[int, ...]:
    # The plan depends on next_pow2(L): a symbolic length is specialised (one graph per plan).
    plan = plan_for(int(seq_len))
    if fourstep.covers(plan.fft_size):
        return fourstep.spectrum_shape(k.shape[0], plan.fft_size)
    return (k.shape[0], *plan.spectrum_shape, 2)


# --------------------------------------------------------------------------- filter_spectrum


@torch.library.custom_op("monarch_fftconv::filter_spectrum", mutates_args=(), device_types="cpu")
def filter_spectrum(k: Tensor, seq_len: int, precision: str) -> Tensor:
    plan = plan_for(seq_len)
    if fourstep.covers(plan.fft_size):
        spectrum = fourstep.filter_spectrum_reference(k, plan.fft_size)
    else:
        spectrum = portable.filter_spectrum(k, plan, precision)
    return torch.view_as_real(spectrum).contiguous()


@filter_spectrum.register_fake
def _(k: Tensor, seq_len: int, precision: str) -> Tensor:
    return k.new_empty(_spectrum_shape(k, seq_len), dtype=compute_dtype(k))


@torch.library.custom_op("monarch_fftconv::filter_spectrum_two_sided", mutates_args=(), device_types="cpu")
def filter_spectrum_two_sided(k: Tensor, seq_len: int, precision: str) -> Tensor:
    """The spectrum of a bidirectional filter bank k (G, 2, Lk), K_fwd + conj(K_rev), in
    filter_spectrum's layout (bidirectional.py): each entry holds one frequency's value, so the
    halves combine entry by entry. CUDA: one launch of the spectrum kernel on the two-sided circle."""
    causal = filter_spectrum(k[:, 0].contiguous(), seq_len, precision)
    anti_causal = filter_spectrum(k[:, 1].contiguous(), seq_len, precision)
    conj = torch.tensor([1.0, -1.0], dtype=anti_causal.dtype)
    return causal + anti_causal * conj


@filter_spectrum_two_sided.register_fake
def _(k: Tensor, seq_len: int, precision: str) -> Tensor:
    return k.new_empty(_spectrum_shape(k, seq_len), dtype=compute_dtype(k))


# --------------------------------------------------------------------------- refresh_filter_spectrum


# refresh_filter_spectrum runs once a call inside inference_cache(), and conv_step_at once a
# token outside a graph (generation.DIRECT_STEP), so both are defined with the low-level library
# API rather than custom_op: custom_op's Python autograd and ADInplaceOrView kernels run at each
# call outside inference_mode (~50 us a call on the CPU here, session 24, against ~20 for the op
# itself; the refresh's 31 us of host time against the forward op's 13 on an H100, session 25).
# The C++ autograd fallback passes conv_step_at through (its mutated buffers never require grad);
# refresh_filter_spectrum has its own C++ kernel at AutogradCUDA (binding.cpp: the fallback cost
# it twice conv_forward's host time, session 36), which refuses gradients and bumps the written
# buffers' versions. binding.cpp registers both ops' CUDA kernels.
_library = torch.library.Library("monarch_fftconv", "FRAGMENT")
_library.define("refresh_filter_spectrum(Tensor k, Tensor(a!) source, Tensor(b!) spectrum, SymInt seq_len, "
                "str precision) -> ()")


def refresh_filter_spectrum_reference(k: Tensor, source: Tensor, spectrum: Tensor, seq_len: int,
                                      precision: str) -> None:
    """Brings `spectrum`, computed from `source` (k's shape, in the compute dtype), up to date
    with k in place: the rows whose filter differs from source, bit for bit, are recomputed and
    source takes their values; the others are not touched. Radix layout only (N <= 32768).
    CUDA: one launch, no host sync (inference_cache uses it there). CPU: this reference of the
    kernel's contract (row by row here; the kernel recomputes a CTA's rows together, the same bits)."""
    plan = plan_for(seq_len)
    if fourstep.covers(plan.fft_size):
        raise ValueError(f"refresh_filter_spectrum: no refresh at N={plan.fft_size} (four-step layout)")
    with torch.no_grad():  # no autograd layer above it (the low-level definition): record nothing
        k = k.to(source.dtype)
        rows = (bits(k) != bits(source)).any(dim=1).nonzero().squeeze(1)
        if rows.numel():
            spectrum[rows] = torch.view_as_real(portable.filter_spectrum(k[rows], plan, precision)).to(spectrum.dtype)
            source[rows] = k[rows]


_library.impl("refresh_filter_spectrum", refresh_filter_spectrum_reference, "CPU")


@torch.library.register_fake("monarch_fftconv::refresh_filter_spectrum")
def _(k, source, spectrum, seq_len, precision):
    return None


def bits(t: Tensor) -> Tensor:
    """t's bits as integers: equal exactly when every bit is (NaN payloads and -0.0 included)."""
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


# --------------------------------------------------------------------------- conv_step


def conv_step_reference(x: Tensor, inputs: Tensor, pending: Tensor, outputs: Tensor | None, first_tap: Tensor,
                        second_tap: Tensor, index: Tensor, fold: bool, block_taps: Tensor | None = None) -> Tensor:
    """One generation step (generation.py) at the generated index i held in `index` (a device
    scalar: a CUDA graph of the step then serves every position): inputs[:, :, i] = x;
    y = pending[:, :, i] + first_tap·x, also into outputs[i] where outputs is given; with fold,
    pending[:, :, i + 1] += second_tap·x (level 0's block). With block_taps (G, n, n), a small
    level's block after that: pending[:, :, i+1+m] += Σ_j inputs[:, :, i+1-n+j]·block_taps[g, j, m]
    for m < n, g = c // (C/G) (generation's Toeplitz product). Returns y. In PyTorch ops: eight
    launches on a GPU (eight more with a block), where the op's CUDA kernel does it in one."""
    at = index.view(1)
    inputs.index_copy_(2, at, x.unsqueeze(-1))
    y = torch.addcmul(pending.index_select(2, at).squeeze(-1), first_tap, x)
    if outputs is not None:
        outputs.index_copy_(0, at, y.unsqueeze(0))
    if fold:
        after = at + 1
        folded = torch.addcmul(pending.index_select(2, after), x.unsqueeze(-1), second_tap.unsqueeze(-1))
        pending.index_copy_(2, after, folded)
    if block_taps is not None:
        n = block_taps.shape[-1]
        offsets = torch.arange(n, device=at.device)
        block = inputs.index_select(2, at + 1 - n + offsets)  # the last n inputs, x the newest
        out = (block.unflatten(1, (block_taps.shape[0], -1)) @ block_taps.unsqueeze(0)).flatten(1, 2)
        targets = at + 1 + offsets
        pending.index_copy_(2, targets, pending.index_select(2, targets) + out)
    return y


@torch.library.custom_op("monarch_fftconv::conv_step", mutates_args=("inputs", "pending", "outputs"),
                         device_types="cpu")
def conv_step(x: Tensor, inputs: Tensor, pending: Tensor, outputs: Tensor | None, first_tap: Tensor,
              second_tap: Tensor, index: Tensor, fold: bool, block_taps: Tensor | None = None) -> Tensor:
    return conv_step_reference(x, inputs, pending, outputs, first_tap, second_tap, index, fold, block_taps)


@conv_step.register_fake
def _(x, inputs, pending, outputs, first_tap, second_tap, index, fold, block_taps=None):
    return x.new_empty(x.shape)


def conv_step_at_reference(x: Tensor, inputs: Tensor, pending: Tensor, outputs: Tensor | None, first_tap: Tensor,
                           second_tap: Tensor, index: Tensor, position: int, fold: bool,
                           block_taps: Tensor | None = None) -> Tensor:
    """`conv_step_reference` at the generated index i = `position`, given by the host (a direct
    step, generation.DIRECT_STEP), with x of any strides; afterwards `index` holds i + 1, as the
    graphed steps' increment leaves it for the graphs of the other levels."""
    at = torch.full_like(index, position)
    y = conv_step_reference(x, inputs, pending, outputs, first_tap, second_tap, at, fold, block_taps)
    index.fill_(position + 1)
    return y


# conv_step_at: defined as refresh_filter_spectrum is (above), for the same reason.
_library.define(
    "conv_step_at(Tensor x, Tensor(a!) inputs, Tensor(b!) pending, Tensor(c!)? outputs, Tensor first_tap, "
    "Tensor second_tap, Tensor(d!) index, SymInt position, bool fold, Tensor? block_taps=None) -> Tensor")


def _conv_step_at_cpu(x: Tensor, inputs: Tensor, pending: Tensor, outputs: Tensor | None, first_tap: Tensor,
                      second_tap: Tensor, index: Tensor, position: int, fold: bool,
                      block_taps: Tensor | None = None) -> Tensor:
    if position < 0 or position >= inputs.shape[-1]:
        raise ValueError(f"monarch_fftconv: conv_step_at's position must be in [0, {inputs.shape[-1]}), got {position}")
    return conv_step_at_reference(x, inputs, pending, outputs, first_tap, second_tap, index, position, fold, block_taps)


_library.impl("conv_step_at", _conv_step_at_cpu, "CPU")


@torch.library.register_fake("monarch_fftconv::conv_step_at")
def _(x, inputs, pending, outputs, first_tap, second_tap, index, position, fold, block_taps=None):
    return inputs.new_empty(x.shape)


# --------------------------------------------------------------------------- conv_block


def conv_block_reference(inputs: Tensor, pending: Tensor, taps: Tensor, index: Tensor, n: int) -> None:
    """A middle fold level's block of a generation step (generation.py) as a direct Toeplitz
    product, at the generated index i held in `index` (a device scalar):
    pending[:, c, i+1+m] += Σ_j inputs[:, c, i+1-n+j]·taps[g, n+m-j] for m, j < n, g = c // (C/G),
    taps (G, >= 2n) holding the filter's k[0 ..] (k[0] unused). The same sums as the level's two
    FFTs on 2n points (generation._block_contribution), in another rounding. In PyTorch ops:
    a gather, a Toeplitz built from the taps, a batched product and a scatter-add; the op's CUDA
    kernel does it in one launch."""
    offsets = torch.arange(n, device=index.device)
    at = index.view(1)
    block = inputs.index_select(2, at + 1 - n + offsets)  # (B, C, n): the last n inputs
    lags = n + offsets - offsets[:, None]  # [j, m] = n + m - j
    toeplitz = taps[:, lags]  # (G, n, n)
    out = (block.unflatten(1, (taps.shape[0], -1)) @ toeplitz.unsqueeze(0)).flatten(1, 2)
    targets = at + 1 + offsets
    pending.index_copy_(2, targets, pending.index_select(2, targets) + out)


@torch.library.custom_op("monarch_fftconv::conv_block", mutates_args=("pending",), device_types="cpu")
def conv_block(inputs: Tensor, pending: Tensor, taps: Tensor, index: Tensor, n: int) -> None:
    conv_block_reference(inputs, pending, taps, index, n)


@conv_block.register_fake
def _(inputs, pending, taps, index, n):
    return None


# --------------------------------------------------------------------------- conv_forward


def _channel_spectrum(filter_spectrum: Tensor, channels: int) -> Tensor:
    """The spectrum as complex, a row per channel: a grouped spectrum's G rows (G dividing C)
    repeated over their groups, as the CUDA binding gives them to its kernels."""
    spectrum = torch.view_as_complex(filter_spectrum.contiguous())
    rows = spectrum.shape[0]
    return spectrum if rows == channels else spectrum.repeat_interleave(channels // rows, dim=0)


def _by_row(channel_grads: Tensor, rows: int) -> Tensor:
    """Per-channel filter gradients (C, ...) summed over each group of channels sharing a row:
    (G, ...), in channel order."""
    channels = channel_grads.shape[0]
    if rows == channels:
        return channel_grads
    return channel_grads.unflatten(0, (rows, channels // rows)).sum(1)


@torch.library.custom_op("monarch_fftconv::conv_forward", mutates_args=(), device_types="cpu")
def conv_forward(u: Tensor, filter_spectrum: Tensor, skip: Tensor | None, precision: str) -> Tensor:
    """y = conv(u, k) (+ skip·u) from k's spectrum: a row per channel, or per group of C/G
    channels (grouped filters)."""
    plan = plan_for(u.shape[-1])
    spectrum = _channel_spectrum(filter_spectrum, u.shape[1])
    if fourstep.covers(plan.fft_size):
        return fourstep.conv_reference(u, spectrum, skip).to(u.dtype)
    return portable.conv_forward(u, spectrum, skip, plan, precision)


@conv_forward.register_fake
def _(u: Tensor, filter_spectrum: Tensor, skip: Tensor | None, precision: str) -> Tensor:
    return torch.empty_like(u, memory_format=torch.contiguous_format)


def _check_gates(u: Tensor, pregate: Tensor | None, postgate: Tensor | None) -> None:
    """The gated ops' gates: each absent or of u's shape and dtype (the kernels index them as u)."""
    for name, gate in (("pregate", pregate), ("postgate", postgate)):
        if gate is not None and (gate.shape != u.shape or gate.dtype != u.dtype):
            raise ValueError(f"monarch_fftconv: {name} must have u's shape {tuple(u.shape)} and dtype {u.dtype}, "
                             f"got {tuple(gate.shape)} {gate.dtype}")


@torch.library.custom_op("monarch_fftconv::gated_conv_forward", mutates_args=(), device_types="cpu")
def gated_conv_forward(u: Tensor, filter_spectrum: Tensor, skip: Tensor | None, pregate: Tensor | None,
                       postgate: Tensor | None, precision: str) -> Tensor:
    """postgate ⊙ (conv(x) + skip·x), x = pregate ⊙ u, each gate optional and of u's shape and
    dtype. Not differentiable (inference). CUDA: the gates fused into the fp32 radix kernel's
    load and store where it runs the call, ATen ops around the conv elsewhere; CPU: the latter.
    With 2-byte I/O the two differ in rounding: the fused kernel multiplies in fp32 and rounds
    y once, the ATen ops round x and y to the I/O dtype."""
    _check_gates(u, pregate, postgate)
    x = u if pregate is None else u * pregate
    y = conv_forward(x, filter_spectrum, skip, precision)
    return y if postgate is None else y * postgate


@gated_conv_forward.register_fake
def _(u: Tensor, filter_spectrum: Tensor, skip: Tensor | None, pregate: Tensor | None, postgate: Tensor | None,
      precision: str) -> Tensor:
    return torch.empty_like(u, memory_format=torch.contiguous_format)


# --------------------------------------------------------------------------- gated training step
# The fused gated training step (issue #39; functional.py's autograd, behind
# backends.FUSED_GATED_TRAINING): the forward keeps z = conv(x) + D·x, x = pregate ⊙ u, so the
# backward's dpostgate = dy ⊙ z is one multiply (in the grad kernel where z is given to it); the
# backward takes both gates into the grad kernel. The CPU implementations compose the ops above
# exactly as the CUDA kernels fuse them.


@torch.library.custom_op("monarch_fftconv::gated_fftconv", mutates_args=(), device_types="cpu")
def gated_fftconv(u: Tensor, k: Tensor, skip: Tensor | None, pregate: Tensor | None, postgate: Tensor | None,
                  precision: str) -> tuple[Tensor, Tensor, Tensor]:
    """(y, z, S): y = postgate ⊙ z, z = conv(x, k) + skip·x, x = pregate ⊙ u, each gate optional
    and of u's shape and dtype; z is returned only with a postgate (else empty: y is z), S is k's
    spectrum (not differentiable). Not differentiable itself: functional.py's autograd calls it.
    CUDA: the spectrum kernel, then the fp32 kernel's gated instance storing z beside y where it
    runs the call (ATen gates around the conv elsewhere)."""
    _check_gates(u, pregate, postgate)
    spectrum = filter_spectrum(k, u.shape[-1], precision)
    x = u if pregate is None else u * pregate
    z = conv_forward(x, spectrum, skip, precision)
    if postgate is None:
        return z, z.new_empty(0), spectrum
    return z * postgate, z, spectrum


@gated_fftconv.register_fake
def _(u: Tensor, k: Tensor, skip: Tensor | None, pregate: Tensor | None, postgate: Tensor | None,
      precision: str) -> tuple[Tensor, Tensor, Tensor]:
    y = torch.empty_like(u, memory_format=torch.contiguous_format)
    z = torch.empty_like(y) if postgate is not None else u.new_empty(0)
    return y, z, k.new_empty(_spectrum_shape(k, u.shape[-1]), dtype=compute_dtype(k))


@torch.library.custom_op("monarch_fftconv::gated_fftconv_backward", mutates_args=(), device_types="cpu")
def gated_fftconv_backward(
    grad: Tensor, u: Tensor, filter_spectrum: Tensor, skip: Tensor | None, pregate: Tensor | None,
    postgate: Tensor | None, filter_len: int, precision: str, z: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(du, dk, dskip, dpregate, dpostgate) of gated_fftconv from dy = grad: dz = postgate ⊙ dy;
    dx, dk and dskip are fftconv_backward's of dz and x = pregate ⊙ u (dk = Σ_b dz ⋆ x, dskip =
    Σ dz·x); du = pregate ⊙ dx, dpregate = u ⊙ dx (empty without a pregate); dpostgate = dy ⊙ z
    where z (gated_fftconv's, given only with a postgate) is given, else empty (the caller's).
    du and both gate gradients in u's dtype, dk and dskip in the compute dtype. CUDA: the gated
    grad kernel, the gates in its loads and store, dpostgate from its own read of dy (fp32 io,
    N <= 32768), else these ATen gates around the ungated backward."""
    _check_gates(u, pregate, postgate)
    if z is not None and (postgate is None or z.shape != u.shape or z.dtype != u.dtype):
        raise ValueError(f"monarch_fftconv: z (for dpostgate) is given only with a postgate, with u's shape "
                         f"{tuple(u.shape)} and dtype {u.dtype}, got {tuple(z.shape)} {z.dtype}"
                         f"{'' if postgate is not None else ' and no postgate'}")
    dy = grad.to(u.dtype)
    x = u if pregate is None else u * pregate
    dz = dy if postgate is None else dy * postgate
    dx, dk, dskip = fftconv_backward(dz, x, filter_spectrum, skip, filter_len, precision)
    dx = dx.to(u.dtype)
    dpostgate = u.new_empty(0) if z is None else dy * z
    if pregate is None:
        return dx, dk, dskip, u.new_empty(0), dpostgate
    return dx * pregate, dk, dskip, dx * u, dpostgate


@gated_fftconv_backward.register_fake
def _(grad: Tensor, u: Tensor, filter_spectrum: Tensor, skip: Tensor | None, pregate: Tensor | None,
      postgate: Tensor | None, filter_len: int, precision: str,
      z: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    du = torch.empty_like(u, memory_format=torch.contiguous_format)
    dk = u.new_empty((filter_spectrum.shape[0], filter_len), dtype=compute_dtype(u))
    dpregate = torch.empty_like(du) if pregate is not None else u.new_empty(0)
    dpostgate = torch.empty_like(du) if z is not None else u.new_empty(0)
    return du, dk, _empty_if_none(None if skip is None else torch.empty_like(skip), u), dpregate, dpostgate


# --------------------------------------------------------------------------- fftconv + autograd


@torch.library.custom_op("monarch_fftconv::fftconv", mutates_args=(), device_types="cpu")
def fftconv(u: Tensor, k: Tensor, skip: Tensor | None, precision: str) -> tuple[Tensor, Tensor]:
    spectrum = filter_spectrum(k, u.shape[-1], precision)
    return conv_forward(u, spectrum, skip, precision), spectrum


@fftconv.register_fake
def _(u: Tensor, k: Tensor, skip: Tensor | None, precision: str) -> tuple[Tensor, Tensor]:
    y = torch.empty_like(u, memory_format=torch.contiguous_format)
    return y, k.new_empty(_spectrum_shape(k, u.shape[-1]), dtype=compute_dtype(k))


@torch.library.custom_op("monarch_fftconv::fftconv_backward", mutates_args=(), device_types="cpu")
def fftconv_backward(
    grad: Tensor, u: Tensor, filter_spectrum: Tensor, skip: Tensor | None, filter_len: int, precision: str
) -> tuple[Tensor, Tensor, Tensor]:
    """(du, dk, dskip) in the compute dtype; dskip is empty when skip is None. dk has a row per
    spectrum row: a grouped filter's row is the sum over its channels."""
    du, dk, dskip = _channel_backward(grad, u, filter_spectrum, skip, filter_len, precision)
    return du, _by_row(dk, filter_spectrum.shape[0]), _empty_if_none(dskip, u)


def _channel_backward(grad: Tensor, u: Tensor, filter_spectrum: Tensor, skip: Tensor | None, lags: int,
                      precision: str) -> tuple[Tensor, Tensor, Tensor | None]:
    """(du, the first `lags` samples of each channel's correlation Σ_b dy ⋆ u, dD), by the
    portable engine or, at the four-step sizes, its reference."""
    plan = plan_for(u.shape[-1])
    spectrum = _channel_spectrum(filter_spectrum, u.shape[1])
    if fourstep.covers(plan.fft_size):
        return fourstep.backward_reference(grad.to(u.dtype), u, spectrum, skip, lags)
    return portable.conv_backward(grad.to(u.dtype), u, spectrum, skip, lags, plan, precision)


@torch.library.custom_op("monarch_fftconv::fftconv_backward_two_sided", mutates_args=(), device_types="cpu")
def fftconv_backward_two_sided(
    grad: Tensor, u: Tensor, filter_spectrum: Tensor, skip: Tensor | None, filter_len: int, precision: str
) -> tuple[Tensor, Tensor, Tensor]:
    """fftconv_backward's (du, dk, dskip) with dk (C, 2, Lk): row 0 the causal lags
    Σ_b Σ_t dy[t]·u[t-s], row 1 the anti-causal ones Σ_b Σ_t dy[t]·u[t+s]. Both lie on the
    backward's one N-point correlation (lag -s at bin N - s): the bidirectional filter's gradient
    (bidirectional.py) in one backward."""
    fft_size = plan_for(u.shape[-1]).fft_size
    du, circle, dskip = _channel_backward(grad, u, filter_spectrum, skip, fft_size, precision)
    return du, _by_row(both_lag_signs(circle, filter_len), filter_spectrum.shape[0]), _empty_if_none(dskip, u)


def both_lag_signs(circle: Tensor, filter_len: int) -> Tensor:
    """(..., N) circular correlation -> (..., 2, Lk): lags s and -s (bin N - s) for s < Lk."""
    fft_size = circle.shape[-1]
    lags = torch.arange(filter_len, device=circle.device)
    return torch.stack([circle[..., :filter_len], circle[..., (fft_size - lags) % fft_size]], dim=-2).contiguous()


@fftconv_backward_two_sided.register_fake
def _(
    grad: Tensor, u: Tensor, filter_spectrum: Tensor, skip: Tensor | None, filter_len: int, precision: str
) -> tuple[Tensor, Tensor, Tensor]:
    du = torch.empty_like(u, memory_format=torch.contiguous_format)
    dk = u.new_empty((filter_spectrum.shape[0], 2, filter_len), dtype=compute_dtype(u))
    return du, dk, _empty_if_none(None if skip is None else torch.empty_like(skip), u)


def _empty_if_none(dskip: Tensor | None, u: Tensor) -> Tensor:
    return u.new_empty(0, dtype=compute_dtype(u)) if dskip is None else dskip


@fftconv_backward.register_fake
def _(
    grad: Tensor, u: Tensor, filter_spectrum: Tensor, skip: Tensor | None, filter_len: int, precision: str
) -> tuple[Tensor, Tensor, Tensor]:
    du = torch.empty_like(u, memory_format=torch.contiguous_format)
    dk = u.new_empty((filter_spectrum.shape[0], filter_len), dtype=compute_dtype(u))
    return du, dk, _empty_if_none(None if skip is None else torch.empty_like(skip), u)


# The training step's forward keeping u's spectrum for its backward (four-step sizes; the CUDA
# autograd under MONARCH_FFTCONV_KEEP_SPECTRUM=1, binding.cpp): the backward then skips the
# spectrum's two launches. X is read, never written, so a second backward (retain_graph) reads
# it again.


def _kept_spectrum_shape(u: Tensor) -> tuple[int, ...]:
    """X's shape, (B, C, P/2+1, M, 2), at the four-step sizes; (0,) below them."""
    fft_size = plan_for(int(u.shape[-1])).fft_size  # a symbolic length is specialised, as above
    if not fourstep.covers(fft_size):
        return (0,)
    return (u.shape[0], u.shape[1], fourstep.spectrum_rows(fft_size), fourstep.inner_for(fft_size), 2)


@torch.library.custom_op("monarch_fftconv::fftconv_keeping_spectrum", mutates_args=(), device_types="cpu")
def fftconv_keeping_spectrum(u: Tensor, k: Tensor, skip: Tensor | None, precision: str) -> tuple[Tensor, Tensor, Tensor]:
    """fftconv's (y, S) and u's spectrum X, (B, C, P/2+1, M, 2) real in the compute dtype
    (fourstep.spectrum_reference's rows; the CUDA forward stores them as its inner kernel
    computes them); empty below N = 65536."""
    spectrum = filter_spectrum(k, u.shape[-1], precision)
    y = conv_forward(u, spectrum, skip, precision)
    fft_size = plan_for(u.shape[-1]).fft_size
    if not fourstep.covers(fft_size):
        return y, spectrum, u.new_empty(0, dtype=compute_dtype(u))
    kept = fourstep.spectrum_reference(u, fft_size, fourstep.inner_for(fft_size))
    return y, spectrum, torch.view_as_real(kept).contiguous()


@fftconv_keeping_spectrum.register_fake
def _(u: Tensor, k: Tensor, skip: Tensor | None, precision: str) -> tuple[Tensor, Tensor, Tensor]:
    y = torch.empty_like(u, memory_format=torch.contiguous_format)
    spectrum = k.new_empty(_spectrum_shape(k, u.shape[-1]), dtype=compute_dtype(k))
    return y, spectrum, u.new_empty(_kept_spectrum_shape(u), dtype=compute_dtype(u))


@torch.library.custom_op("monarch_fftconv::fftconv_backward_from_spectrum", mutates_args=(), device_types="cpu")
def fftconv_backward_from_spectrum(
    grad: Tensor, u: Tensor, u_spectrum: Tensor, filter_spectrum: Tensor, skip: Tensor | None, filter_len: int,
    precision: str
) -> tuple[Tensor, Tensor, Tensor]:
    """fftconv_backward's (du, dk, dskip), given u's spectrum as fftconv_keeping_spectrum
    returned it (empty below N = 65536, where this is fftconv_backward)."""
    expected = _kept_spectrum_shape(u)
    if tuple(u_spectrum.shape) != expected or u_spectrum.dtype != compute_dtype(u):
        raise ValueError(f"monarch_fftconv: u_spectrum must be {compute_dtype(u)} {list(expected)} "
                         f"(fftconv_keeping_spectrum's), got {u_spectrum.dtype} {list(u_spectrum.shape)}")
    if expected == (0,):
        du, dk, dskip = _channel_backward(grad, u, filter_spectrum, skip, filter_len, precision)
    else:
        spectrum = _channel_spectrum(filter_spectrum, u.shape[1])
        du, dk, dskip = fourstep.backward_reference(grad.to(u.dtype), u, spectrum, skip, filter_len,
                                                    u_spectrum=torch.view_as_complex(u_spectrum.contiguous()))
    return du, _by_row(dk, filter_spectrum.shape[0]), _empty_if_none(dskip, u)


@fftconv_backward_from_spectrum.register_fake
def _(
    grad: Tensor, u: Tensor, u_spectrum: Tensor, filter_spectrum: Tensor, skip: Tensor | None, filter_len: int,
    precision: str
) -> tuple[Tensor, Tensor, Tensor]:
    du = torch.empty_like(u, memory_format=torch.contiguous_format)
    dk = u.new_empty((filter_spectrum.shape[0], filter_len), dtype=compute_dtype(u))
    return du, dk, _empty_if_none(None if skip is None else torch.empty_like(skip), u)


def _setup_context(ctx, inputs, output) -> None:
    u, k, skip, precision = inputs
    _, spectrum = output
    ctx.mark_non_differentiable(spectrum)
    ctx.save_for_backward(u, spectrum, skip)
    ctx.filter_len, ctx.filter_dtype, ctx.precision = k.shape[-1], k.dtype, precision


def _backward(ctx, grad: Tensor, _grad_spectrum: Tensor | None):
    u, spectrum, skip = ctx.saved_tensors
    du, dk, dskip = fftconv_backward(grad, u, spectrum, skip, ctx.filter_len, ctx.precision)
    needs_u, needs_k, needs_skip, _ = ctx.needs_input_grad
    return (
        du.to(u.dtype) if needs_u else None,
        dk.to(ctx.filter_dtype) if needs_k else None,
        dskip.to(skip.dtype) if needs_skip else None,
        None,
    )


# CPU autograd; CUDA tensors take the same autograd in C++ (binding.cpp, AutogradCUDA).
torch.library.register_autograd("monarch_fftconv::fftconv", _backward, setup_context=_setup_context)


# The overloads themselves, for the call path: calling a CustomOpDef adds a Python frame.
filter_spectrum_op = torch.ops.monarch_fftconv.filter_spectrum.default
filter_spectrum_two_sided_op = torch.ops.monarch_fftconv.filter_spectrum_two_sided.default
conv_step_op = torch.ops.monarch_fftconv.conv_step.default
conv_step_at_op = torch.ops.monarch_fftconv.conv_step_at.default
conv_block_op = torch.ops.monarch_fftconv.conv_block.default
refresh_filter_spectrum_op = torch.ops.monarch_fftconv.refresh_filter_spectrum.default
conv_forward_op = torch.ops.monarch_fftconv.conv_forward.default
gated_conv_forward_op = torch.ops.monarch_fftconv.gated_conv_forward.default
gated_fftconv_op = torch.ops.monarch_fftconv.gated_fftconv.default
gated_fftconv_backward_op = torch.ops.monarch_fftconv.gated_fftconv_backward.default
fftconv_op = torch.ops.monarch_fftconv.fftconv.default
fftconv_backward_op = torch.ops.monarch_fftconv.fftconv_backward.default
fftconv_keeping_spectrum_op = torch.ops.monarch_fftconv.fftconv_keeping_spectrum.default
fftconv_backward_from_spectrum_op = torch.ops.monarch_fftconv.fftconv_backward_from_spectrum.default
fftconv_backward_two_sided_op = torch.ops.monarch_fftconv.fftconv_backward_two_sided.default
