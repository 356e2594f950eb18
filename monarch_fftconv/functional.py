"""The public functions: `fftconv` and `explain`, with their input checks."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from . import backends, ops, policy, torch_fft
from .backends import BACKEND_ENV, TC_KERNEL_ENV, Backend, TorchFFT, select_backend
from .planner import plan_for

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class ArgNames:
    """What error messages call the arguments: the function's names, or the module's."""

    u: str = "u"
    k: str = "k"
    D: str = "D"
    pregate: str = "pregate"
    postgate: str = "postgate"


FUNCTION_NAMES = ArgNames()


def _check_float_tensor(name: str, t: object, optional: bool = False) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor{' or None' if optional else ''}, got {type(t).__name__}")
    if t.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be a real floating-point tensor (float16/bfloat16/float32/float64), got {t.dtype}")


def check_inputs(
    u: object, k: object, D: object = None, names: ArgNames = FUNCTION_NAMES, *,
    pregate: object = None, postgate: object = None, bidirectional: object = False,
) -> None:
    """Raise TypeError/ValueError naming the problem; compute nothing. u is (..., C, L); k is
    (G, Lk), or (G, 2, Lk) when bidirectional, with G dividing C; the gates are u's shape."""
    _check_float_tensor(names.u, u)
    _check_float_tensor(names.k, k)
    assert isinstance(u, Tensor) and isinstance(k, Tensor)
    bidirectional = bidirectional_convention(bidirectional) is not None
    if u.dim() < 2:
        raise ValueError(f"{names.u} must have shape (..., C, L), got {tuple(u.shape)}")
    if bidirectional and (k.dim() != 3 or k.shape[1] != 2):
        raise ValueError(f"{names.k} must have shape (C, 2, Lk) or (G, 2, Lk) with bidirectional=True "
                         f"([:, 0] causal, [:, 1] anti-causal), got {tuple(k.shape)}")
    if not bidirectional and k.dim() != 2:
        hint = "; a (G, 2, Lk) filter needs bidirectional=True" if k.dim() == 3 and k.shape[1] == 2 else ""
        raise ValueError(f"{names.k} must have shape (C, Lk) or (G, Lk), got {tuple(k.shape)}{hint}")
    channels, length = u.shape[-2:]
    if 0 in (channels, length) or k.numel() == 0:  # an empty batch is fine: an empty result
        raise ValueError(f"empty dimension: {names.u} {tuple(u.shape)}, {names.k} {tuple(k.shape)}")
    if channels % k.shape[0]:
        raise ValueError(f"channel mismatch: {names.u} has {channels} channels, {names.k} has {k.shape[0]}; "
                         f"G filters serve C channels when C % G == 0 (channel c takes filter c // (C // G))")
    if k.shape[-1] > length:
        raise ValueError(f"{names.k} longer than the sequence: Lk={k.shape[-1]} > L={length}")
    if k.device != u.device:
        raise ValueError(f"{names.u} and {names.k} are on different devices: {u.device} and {k.device}")
    if D is not None:
        _check_float_tensor(names.D, D, optional=True)
        assert isinstance(D, Tensor)
        if tuple(D.shape) != (channels,):
            raise ValueError(f"{names.D} must have shape ({channels},), got {tuple(D.shape)}")
        if D.device != u.device:
            raise ValueError(f"{names.u} and {names.D} are on different devices: {u.device} and {D.device}")
    for name, gate in ((names.pregate, pregate), (names.postgate, postgate)):
        if gate is None:
            continue
        _check_float_tensor(name, gate, optional=True)
        assert isinstance(gate, Tensor)
        if not _broadcasts_to(gate.shape, u.shape):
            raise ValueError(f"{name} must have {names.u}'s shape {tuple(u.shape)} (leading dims may be 1 or "
                             f"absent), got {tuple(gate.shape)}")
        if gate.device != u.device:
            raise ValueError(f"{names.u} and {name} are on different devices: {u.device} and {gate.device}")


# Where the anti-causal half's tap s sits (issue #39): one name per published convention.
BIDIRECTIONAL_CONVENTIONS = {
    "fftconv_ref": "tap s at lag -s, lag 0 taking both halves' first tap: fftconv_ref(u, k, D, k_rev=...) of "
                   "safari, savanna and Monarch Mixer",
    "m2": "tap s at lag -(s+1): Monarch Mixer's bidirectional HyenaFilter (M2-BERT), which places the "
          "reversed filter after the causal one on the 2L-point circle",
}


def bidirectional_convention(bidirectional: object) -> str | None:
    """None for a causal call, else the convention's name: False, True (= "fftconv_ref", the
    meaning True has always had in `fftconv`), "fftconv_ref" or "m2"."""
    if bidirectional is False:
        return None
    if bidirectional is True:
        return "fftconv_ref"
    if not isinstance(bidirectional, str):
        raise TypeError(f"bidirectional must be a bool or a convention's name ('fftconv_ref', 'm2'), "
                        f"got {type(bidirectional).__name__}")
    if bidirectional not in BIDIRECTIONAL_CONVENTIONS:
        raise ValueError(f"bidirectional must be False, True (= 'fftconv_ref'), 'fftconv_ref' or 'm2', "
                         f"got {bidirectional!r}")
    return bidirectional


def _m2_as_fftconv_ref(k: Tensor, length: int) -> Tensor:
    """A (G, 2, Lk) filter of the "m2" convention as the same convolution in "fftconv_ref"'s:
    the anti-causal half delayed by one tap (Lk + 1 taps, the causal half padded). A tap pushed
    to lag -L is dropped: it only ever meets the zero padding."""
    taps = min(k.shape[-1] + 1, length)
    causal = F.pad(k[:, 0], (0, taps - k.shape[-1]))
    anti_causal = F.pad(k[:, 1], (1, 0))[..., :taps]
    return torch.stack([causal, anti_causal], dim=1)


def _broadcasts_to(gate: torch.Size, target: torch.Size) -> bool:
    """Whether a gate of shape `gate` multiplies u of shape `target` elementwise: the same
    (C, L), leading dims each 1 or u's, none beyond u's."""
    if len(gate) < 2 or len(gate) > len(target) or gate[-2:] != target[-2:]:
        return False
    return all(g in (1, t) for g, t in zip(gate[:-2], target[len(target) - len(gate):-2]))


def fftconv(
    u: Tensor, k: Tensor, *, D: Tensor | None = None, pregate: Tensor | None = None,
    postgate: Tensor | None = None, bidirectional: bool | str = False, precision: str | None = None,
) -> Tensor:
    """Long convolution over each channel, with the gates and skip term of Hyena operators.

        x = pregate ⊙ u
        y = postgate ⊙ (conv(x, k) + D ⊙ x)

    conv(x, k)[b, c, t] = Σ_{s<=t} k[g, s]·x[b, c, t-s], g = c // (C // G): channel c takes
    filter g of a bank of G filters (G = C: one per channel). Bidirectional calls take k of shape
    (G, 2, Lk), k[:, 0] causal and k[:, 1] anti-causal, in one of two conventions, each named:

        bidirectional="fftconv_ref" (or True):
            conv(x, k)[b, c, t] = Σ_{s>=0} k[g, 0, s]·x[b, c, t-s] + Σ_{s>=0} k[g, 1, s]·x[b, c, t+s]
        bidirectional="m2":
            conv(x, k)[b, c, t] = Σ_{s>=0} k[g, 0, s]·x[b, c, t-s] + Σ_{s>=0} k[g, 1, s]·x[b, c, t+s+1]

    "fftconv_ref": lag 0 takes both halves' first tap, the filter spectrum rfft(k[:, 0]) +
    conj(rfft(k[:, 1])), as `fftconv_ref(u, k, D, k_rev=...)` of safari, Monarch Mixer and
    savanna define it (HazyResearch/safari src/models/sequence/hyena.py, HazyResearch/m2
    bert/src/mm/hyena_utils.py, Zymrael/savanna savanna/ops/fftconv.py). "m2": the reverse
    half one lag further out, as M2-BERT's bidirectional HyenaFilter builds its filter (the
    reversed taps after the causal ones on the 2L-point circle). Every output is a linear
    convolution: zero-padded to N = 2·next_pow2(L), nothing wraps around.

    D scales the gated input x, as in safari's HyenaOperator (v = v ⊙ x_i, then
    fftconv(v, k, bias)); pregate/postgate are FlashFFTConv's gates (HazyResearch/flash-fft-conv,
    `FlashFFTConv.forward(u, k, pregate, postgate)`), each optional here.

    Grouping is inferred from the shapes: any k of G rows with C % G == 0 is a bank of G filters,
    each serving C // G consecutive channels (`explain()` reports G and C // G); G == C is one
    filter per channel. A k whose row count merely divides C is therefore taken as grouped, not
    refused: `FFTConv`, which knows its channel count, refuses any other.

    u: (B, C, L), (C, L) or (..., C, L); k: (G, Lk) or, bidirectional, (G, 2, Lk), with C % G == 0
    and 1 <= Lk <= L; D: optional (C,); pregate, postgate: optional, u's shape (leading dims may
    be 1 or absent), any float dtype. x is formed in the promoted dtype of u and pregate, so a
    wider gate widens the convolution (its default precision follows x's dtype). Returns y of
    u's shape and dtype, differentiable in u, k, D and both gates; a grouped filter's gradient
    is the sum over its channels. `precision` is "fp32", "tf32", "bf16", "fp16" or None (see
    `monarch_fftconv.policy` for how None is resolved).

    Where the fp32 kernel runs a causal float32 call with gates of u's shape and dtype, it takes them
    (`backends.FUSED_GATE_IO_DTYPES`; docs/design.md): in its forward when no gradient is recorded
    (`backends.FUSED_GATES`), and in its forward and backward kernels when one is
    (`backends.FUSED_GATED_TRAINING`); both on by default. Such a call asking for bf16/fp16 runs
    there too, fp32-accurate (`backends.GATED_CALLS_ON_FP32`: faster than the tensor cores with the
    gates around them). Elsewhere the gates are elementwise ATen ops around the convolution (one
    autograd graph), on every backend.
    Bidirectional calls run where the causal call would, the
    Monarch kernels on the folded spectrum K_fwd + conj(K_rev) (bidirectional.py; `explain()`).
    """
    return conv(u, k, D, precision, pregate=pregate, postgate=postgate, bidirectional=bidirectional)


SpectrumCache = Callable[[Backend, Tensor, str], Tensor]


def conv(
    u: Tensor,
    k: Tensor,
    D: Tensor | None,
    precision: str | None,
    module_precision: str | None = None,
    cached_spectrum: SpectrumCache | None = None,
    names: ArgNames = FUNCTION_NAMES,
    *,
    pregate: Tensor | None = None,
    postgate: Tensor | None = None,
    bidirectional: bool | str = False,
) -> Tensor:
    """The one call path, for `fftconv` and `FFTConv`: check, gate, resolve the precision, pick
    the backend, run it, gate. The checks and decisions are made once per `_call_key` and
    remembered (`_decided`). `cached_spectrum(backend, k, precision)` (a module inside an
    `inference_cache()` block) supplies k's spectrum when autograd is not recording. A
    compiled graph computes the spectrum in the graph instead: the cache's checks are
    host-side state that torch.compile cannot trace, and the graph then follows every filter
    update."""
    key = _call_key(u, k, D, pregate, postgate, bidirectional, precision, module_precision)
    try:
        decided = _decided.get(key)
    except TypeError:  # an unhashable flag or precision: not remembered, the checks name it
        key, decided = None, None
    if decided is None:
        decided = _decide(u, k, D, pregate, postgate, bidirectional, precision, module_precision, names)
        if key is not None:
            if len(_decided) >= _MAX_DECISIONS:
                _decided.clear()
            _decided[key] = decided
    backend, chosen, skip_dtype, flat = decided
    if backend is None:
        return _empty_batch(u, k, D, pregate, postgate)
    if skip_dtype == torch.float64 and k.dtype != torch.float64:
        k = k.to(torch.float64)  # float64 input computes in float64 (its spectrum too), whatever k's dtype
    if not isinstance(backend, TorchFFT) and torch_fft.in_transform():
        # The package's ops have a backward but no forward-mode formula, and PyTorch drops a tangent
        # through them without a word: forward-mode AD and torch.func's transforms take torch.fft's
        # plain ATen ops, whose tangents and batching rules are exact.
        backend, cached_spectrum = _TRANSFORM_BACKEND, None
    if _gates_fuse(backend, u, pregate, postgate, k, D, bidirectional):
        return _gated_inference(backend, u, k, D if D is None or D.dtype == skip_dtype else D.to(skip_dtype),
                                pregate, postgate, chosen, flat, cached_spectrum)
    if _gated_training_fuses(backend, u, pregate, postgate, k, D, bidirectional):
        return _gated_training(backend, u, k, D if D is None or D.dtype == skip_dtype else D.to(skip_dtype),
                               pregate, postgate, chosen, flat)
    x = u if pregate is None else u * pregate  # u's shape (checked), the promoted dtype
    if flat:
        x = x.reshape(-1, *u.shape[-2:])  # (..., C, L) -> (B, C, L): a view unless the strides forbid
    skip = D if D is None or D.dtype == skip_dtype else D.to(skip_dtype)
    if bidirectional == "m2":  # checked above: k is (G, 2, Lk)
        k = _m2_as_fftconv_ref(k, u.shape[-1])
    if cached_spectrum is not None and not _records_grad(x, k, D) and not torch.compiler.is_compiling():
        y = backend.conv(x, cached_spectrum(backend, k, chosen), skip, chosen)
    else:
        y = backend.fftconv(x, k, skip, chosen)
    if flat:
        y = y.reshape(u.shape)
    if postgate is not None:
        y = y * postgate
    return y if y.dtype == u.dtype else y.to(u.dtype)


def _kernel_takes_gates(backend: Backend, u: Tensor, pregate: Tensor | None, postgate: Tensor | None,
                        bidirectional: bool | str) -> bool:
    """Whether the call's gates can go into the kernel: a causal call on a backend whose kernel
    takes gates, u of a dtype whose fused call measured faster (`backends.FUSED_GATE_IO_DTYPES`),
    with gates of u's own shape and dtype (a broadcast or promoting gate keeps the elementwise ops)."""
    return backend.fuses_gates and _gates_fit_the_kernel(u, pregate, postgate, bidirectional)


def _gates_fit_the_kernel(u: Tensor, pregate: Tensor | None, postgate: Tensor | None,
                          bidirectional: bool | str) -> bool:
    """The call's side of `_kernel_takes_gates`: causal, u of `backends.FUSED_GATE_IO_DTYPES`,
    gates of u's own shape and dtype."""
    return (not bidirectional and u.dtype in backends.FUSED_GATE_IO_DTYPES
            and all(g is None or (g.shape == u.shape and g.dtype == u.dtype) for g in (pregate, postgate)))


def _fp32_fuses_gates(u: Tensor, pregate: Tensor | None, postgate: Tensor | None, bidirectional: bool | str) -> bool:
    """Whether the fp32 kernel would take this call's gates, with or without a gradient recorded
    (both fusion flags on): what sends a half-precision gated call to it
    (`backends.GATED_CALLS_ON_FP32`, select_backend's fp32_fuses_gates)."""
    return ((pregate is not None or postgate is not None) and backends.FUSED_GATES and backends.FUSED_GATED_TRAINING
            and _gates_fit_the_kernel(u, pregate, postgate, bidirectional))


def _gates_fusable(backend: Backend, u: Tensor, pregate: Tensor | None, postgate: Tensor | None,
                   bidirectional: bool | str) -> bool:
    """Whether a call that records no gradient takes its gates into the kernel
    (`Backend.gated_conv`): `backends.FUSED_GATES` on and `_kernel_takes_gates`."""
    return backends.FUSED_GATES and _kernel_takes_gates(backend, u, pregate, postgate, bidirectional)


def _gated_training_fuses(backend: Backend, u: Tensor, pregate: Tensor | None, postgate: Tensor | None, k: Tensor,
                          D: Tensor | None, bidirectional: bool | str) -> bool:
    """Whether this gated call that records a gradient runs the fused gated training step
    (`_FusedGatedTraining`): `backends.FUSED_GATED_TRAINING` on (the default) and `_kernel_takes_gates`."""
    gated = pregate is not None or postgate is not None
    return (gated and backends.FUSED_GATED_TRAINING and _kernel_takes_gates(backend, u, pregate, postgate, bidirectional)
            and _records_grad(u, k, D, pregate, postgate))


def _gates_fuse(backend: Backend, u: Tensor, pregate: Tensor | None, postgate: Tensor | None, k: Tensor,
                D: Tensor | None, bidirectional: bool | str) -> bool:
    """Whether this gated call's gates go into the kernel: `_gates_fusable`, and no gradient recorded."""
    gated = pregate is not None or postgate is not None
    return (gated and _gates_fusable(backend, u, pregate, postgate, bidirectional)
            and not _records_grad(u, k, D, pregate, postgate))


def _gated_inference(
    backend: Backend, u: Tensor, k: Tensor, skip: Tensor | None, pregate: Tensor | None, postgate: Tensor | None,
    precision: str, flat: bool, cached_spectrum: SpectrumCache | None,
) -> Tensor:
    """postgate ⊙ (conv(pregate ⊙ u, k) + D ⊙ x) with the gates in the kernel's load and store."""
    if cached_spectrum is not None and not torch.compiler.is_compiling():
        spectrum = cached_spectrum(backend, k, precision)
    else:
        spectrum = backend.filter_spectrum(k, u.shape[-1], precision)
    shape = u.shape
    if flat:  # (..., C, L) -> (B, C, L), the gates alike (they have u's shape)
        u, pregate, postgate = (None if t is None else t.reshape(-1, *shape[-2:]) for t in (u, pregate, postgate))
    y = backend.gated_conv(u, spectrum, skip, pregate, postgate, precision)
    return y.reshape(shape) if flat else y


class _FusedGatedTraining(torch.autograd.Function):
    """y = postgate ⊙ z, z = conv(x, k) + D ⊙ x, x = pregate ⊙ u (u and the gates (B, C, L), k a
    filter per channel) with the gates in the kernels both ways (ops.gated_fftconv and
    ops.gated_fftconv_backward). Saved: u, both gates, k's spectrum and, with a postgate, z;
    dpostgate = dy ⊙ z is the one elementwise op left (docs/design.md, "The gated training step"),
    in the grad kernel's own read of dy where `backends.DPOSTGATE_IN_GRAD_KERNEL` was on at the
    forward."""

    @staticmethod
    def forward(ctx, u, k, skip, pregate, postgate, precision):
        y, z, spectrum = ops.gated_fftconv_op(u, k, skip, pregate, postgate, precision)
        ctx.save_for_backward(u, spectrum, skip, pregate, postgate, z if postgate is not None else None)
        ctx.filter_len, ctx.filter_dtype, ctx.precision = k.shape[-1], k.dtype, precision
        ctx.dpostgate_in_kernel = backends.DPOSTGATE_IN_GRAD_KERNEL  # the route, decided with the forward's
        return y

    @staticmethod
    def backward(ctx, dy):
        u, spectrum, skip, pregate, postgate, z = ctx.saved_tensors
        needs_u, needs_k, needs_skip, needs_pregate, needs_postgate, _ = ctx.needs_input_grad
        dpostgate_in_kernel = postgate is not None and needs_postgate and ctx.dpostgate_in_kernel
        du, dk, dskip, dpregate, dpostgate = ops.gated_fftconv_backward_op(
            dy.contiguous(), u, spectrum, skip, pregate, postgate, ctx.filter_len, ctx.precision,
            z if dpostgate_in_kernel else None)
        if postgate is not None and needs_postgate and not dpostgate_in_kernel:
            dpostgate = dy * z
        return (
            du if needs_u else None,
            dk.to(ctx.filter_dtype) if needs_k else None,
            dskip.to(skip.dtype) if skip is not None and needs_skip else None,
            dpregate if pregate is not None and needs_pregate else None,
            dpostgate if postgate is not None and needs_postgate else None,
            None,
        )


def _gated_training(
    backend: Backend, u: Tensor, k: Tensor, skip: Tensor | None, pregate: Tensor | None, postgate: Tensor | None,
    precision: str, flat: bool,
) -> Tensor:
    """The fused gated training step (`_FusedGatedTraining`) on (B, C, L), a grouped filter bank
    given as the other ops take it (`backends._filter_rows`: its G rows, or with GROUPS_IN_KERNELS
    off repeated to a row per channel, the repeat's gradient, each group's sum, autograd's)."""
    shape = u.shape
    if flat:  # (..., C, L) -> (B, C, L), the gates alike (they have u's shape)
        u, pregate, postgate = (None if t is None else t.reshape(-1, *shape[-2:]) for t in (u, pregate, postgate))
    y = _FusedGatedTraining.apply(u, backends._filter_rows(k, shape[-2]), skip, pregate, postgate,
                                  backend.runs_as or precision)
    return y.reshape(shape) if flat else y


# What `conv` decided per call key: (backend, precision, skip dtype, whether u is flattened to
# (B, C, L)); backend None for an empty batch. Bounded: cleared when full.
_decided: dict[tuple, tuple] = {}
_MAX_DECISIONS = 512
_ENV_NAMES = (policy.ENV_VAR, BACKEND_ENV, TC_KERNEL_ENV)  # every variable a decision reads


_TRANSFORM_BACKEND = TorchFFT("torch.fft", "torch.fft rfft/irfft as plain ATen ops (inside a torch.func transform "
                              "or forward-mode AD)", "the package's ops define a backward alone: PyTorch would drop "
                              "a tangent through them without a word")


def _call_key(
    u: object, k: object, D: object, pregate: object, postgate: object, bidirectional: object,
    precision: object, module_precision: object,
) -> tuple | None:
    """Everything the checks and the decisions of a call read, or None where they are not
    remembered (a compiled graph, an argument that is no tensor). Each tensor argument's type,
    shape, dtype and device (the checks read nothing else of it), the flag with its type (1 ==
    True), the precision argument and attribute, the innermost precision() block of this
    thread and the raw environment variables (the policy and the backend choice read them at
    call time; os.environ's own mapping, as os.environ.get reads it, at a tenth of its cost),
    `backends.ENGINE_ROUTE` with `ENGINE_ROUTE_PRECISIONS` and, for a gated call, the gate flags
    the backend choice reads."""
    if torch.compiler.is_compiling():
        return None
    try:
        key = (type(u), u.shape, u.dtype, u.device, type(k), k.shape, k.dtype, k.device,  # type: ignore[attr-defined]
               type(bidirectional), bidirectional, precision, module_precision,
               stack[-1] if (stack := policy.overrides.stack) else None, _environment(), backends.ENGINE_ROUTE,
               tuple(backends.ENGINE_ROUTE_PRECISIONS))
        if D is not None:
            key += (type(D), D.shape, D.dtype, D.device)  # type: ignore[attr-defined]
        if pregate is not None:
            key += (0, type(pregate), pregate.shape, pregate.dtype, pregate.device)  # type: ignore[attr-defined]
        if postgate is not None:
            key += (1, type(postgate), postgate.shape, postgate.dtype, postgate.device)  # type: ignore[attr-defined]
        if pregate is not None or postgate is not None:  # what _fp32_fuses_gates and the backend read
            key += (backends.FUSED_GATES, backends.FUSED_GATED_TRAINING, backends.FUSED_GATE_IO_DTYPES,
                    backends.GATED_CALLS_ON_FP32)
    except AttributeError:  # not a tensor: the checks name it
        return None
    return key


def _environment() -> tuple:
    environ = os.environ
    if _ENV_KEYS is not None and type(environ) is _ENVIRON:
        data, (a, b, c) = environ._data, _ENV_KEYS  # type: ignore[attr-defined]
        return data.get(a), data.get(b), data.get(c)
    return tuple(map(environ.get, _ENV_NAMES))


# CPython's os.environ keeps its values in `_data`, under `encodekey(name)`: os.environ.get
# reads them there. Elsewhere (or if that ever changes), os.environ.get.
_ENVIRON = type(os.environ)
_ENV_KEYS = (tuple(map(os.environ.encodekey, _ENV_NAMES))  # type: ignore[attr-defined]
             if hasattr(os.environ, "encodekey") and isinstance(getattr(os.environ, "_data", None), dict) else None)


def _decide(
    u: Tensor, k: Tensor, D: Tensor | None, pregate: Tensor | None, postgate: Tensor | None,
    bidirectional: bool | str, precision: str | None, module_precision: str | None, names: ArgNames,
) -> tuple:
    """Check the inputs (raising on a bad one) and decide the call: conv's `_decided` entry."""
    check_inputs(u, k, D, names, pregate=pregate, postgate=postgate, bidirectional=bidirectional)
    if u.numel() == 0:
        return None, None, None, False
    dtype = u.dtype if pregate is None else torch.promote_types(u.dtype, pregate.dtype)
    chosen, _ = policy.resolve(precision, dtype, module_precision)
    length = u.shape[-1]
    backend = select_backend(u.device, dtype, chosen, plan_for(length), u.numel() // length,
                             bidirectional=bidirectional,
                             fp32_fuses_gates=_fp32_fuses_gates(u, pregate, postgate, bidirectional))
    return backend, chosen, torch.float64 if dtype == torch.float64 else torch.float32, u.dim() != 3


def _empty_batch(u: Tensor, k: Tensor, *others: Tensor | None) -> Tensor:
    """y for an empty batch: empty, in u's dtype, with zero gradients for k, D and the gates
    (their sum over no sequences), as autograd gives them for any other batch. (torch.fft
    itself fails on an empty batch on CPU.)"""
    weights = k.sum()
    for t in others:
        if t is not None:
            weights = weights + t.sum()
    return u * weights.to(u.dtype) * 0


def _records_grad(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def explain(
    u: Tensor, k: Tensor, *, D: Tensor | None = None, pregate: Tensor | None = None,
    postgate: Tensor | None = None, bidirectional: bool | str = False, precision: str | None = None,
) -> dict[str, Any]:
    """Which backend and kernel `fftconv(u, k, ...)` with the same arguments would use, and why.
    Never builds the CUDA extension: before the first CUDA call has loaded it, the backend
    is "pending".

    Keys: backend, kernel, reason, precision (the flag: "fp32" means fp32-accurate or better),
    precision_source, arithmetic (what the kernel computes in: "fp64" for float64 input on
    torch.fft, "fp32" when the fp32 kernel serves a bf16 call; None when pending), fft_size,
    factors, flops (real flops of one forward call as the chosen algorithm does it, the
    elementwise terms included; None when pending), stages (the CUDA launches of one forward
    call in order, each {"stage", "reads", "writes"} with the HBM bytes it moves at least; None
    for torch.fft and when pending), groups (G, the filters: k's rows), group_size (C // G, the
    channels sharing one, inferred from the shapes as `fftconv` infers it), bidirectional (False
    or the convention's name, "fftconv_ref" or "m2"), terms ({name: where it is computed} for each
    of pregate, D, postgate the call has, in the order they apply)."""
    check_inputs(u, k, D, pregate=pregate, postgate=postgate, bidirectional=bidirectional)
    conv_dtype = u.dtype if pregate is None else torch.promote_types(u.dtype, pregate.dtype)
    chosen, source = policy.resolve(precision, conv_dtype, None)
    plan = plan_for(u.shape[-1])
    channels = u.shape[-2]
    batch = u.numel() // (channels * u.shape[-1])
    convention = bidirectional_convention(bidirectional)
    backend = select_backend(u.device, conv_dtype, chosen, plan, batch * channels, build=False,
                             bidirectional=convention is not None,
                             fp32_fuses_gates=_fp32_fuses_gates(u, pregate, postgate, convention is not None))
    groups = k.shape[0]
    filter_rows = groups * (2 if bidirectional else 1)
    terms = {}
    # The gates go into the kernel when no gradient is recorded (`_gates_fuse`): explain() says
    # where they would run without one, and that a training step keeps them outside.
    fusable = _gates_fusable(backend, u, pregate, postgate, convention is not None)

    def fused_gate(where: str) -> str:
        if backends.FUSED_GATED_TRAINING:
            return f"fused into the fp32 kernel's {where}, forward and backward (backends.FUSED_GATED_TRAINING)"
        return (f"fused into the fp32 kernel's {where} where no gradient is recorded (inference); "
                f"an elementwise op when autograd records the call")

    def gate_term(where: str, unfused: str) -> str:
        if isinstance(backend, backends.Pending):  # whether the loaded backend fuses is not known yet
            return backend.skip_term
        return fused_gate(where) if fusable else unfused

    if pregate is not None:
        terms["pregate"] = "x = pregate ⊙ u, " + gate_term("load", "an elementwise op before the convolution")
    if D is not None:
        terms["D"] = f"D ⊙ x, {backend.skip_term}"
    if postgate is not None:
        terms["postgate"] = "postgate ⊙ (...), " + gate_term("store", "an elementwise op after the convolution")
    flops = backend.flops(plan, batch, channels, filter_rows)
    stages = backend.stages(plan, batch, channels, conv_dtype.itemsize, groups)
    if flops is not None:
        elementwise = (pregate is not None) + 2 * (D is not None) + (postgate is not None)  # per output
        flops += elementwise * batch * channels * u.shape[-1]
    if stages is not None:
        stages = _gate_stages(u, pregate, postgate, conv_dtype, stages)
    return {
        "backend": backend.name,
        "kernel": backend.kernel,
        "reason": backend.reason,
        "precision": chosen,
        "precision_source": source,
        "arithmetic": backend.arithmetic(chosen, conv_dtype),
        "fft_size": plan.fft_size,
        "factors": plan.factors,
        "flops": flops,
        "stages": stages,
        "groups": groups,
        "group_size": channels // groups,
        "bidirectional": convention or False,
        "terms": terms,
    }


def _gate_stages(
    u: Tensor, pregate: Tensor | None, postgate: Tensor | None, conv_dtype: torch.dtype, conv: list[dict],
) -> list[dict]:
    """The convolution's launches with the gates' around them, as a call that records a gradient
    runs them (and every call while `backends.FUSED_GATES` is off): each gate an ATen launch
    that reads its operands and writes the product (and a cast when it leaves u's dtype)."""
    elements = u.numel()
    before, after = [], []
    if pregate is not None:
        before.append({"stage": "pregate: x = pregate ⊙ u (ATen, not fused)",
                       "reads": elements * u.element_size() + pregate.numel() * pregate.element_size(),
                       "writes": elements * conv_dtype.itemsize})
    out_dtype = conv_dtype
    if postgate is not None:
        out_dtype = torch.promote_types(conv_dtype, postgate.dtype)
        after.append({"stage": "postgate: postgate ⊙ y (ATen, not fused)",
                      "reads": elements * conv_dtype.itemsize + postgate.numel() * postgate.element_size(),
                      "writes": elements * out_dtype.itemsize})
    if out_dtype != u.dtype:
        after.append({"stage": f"cast to {str(u.dtype).removeprefix('torch.')} (ATen)",
                      "reads": elements * out_dtype.itemsize, "writes": elements * u.element_size()})
    return [*before, *conv, *after]
