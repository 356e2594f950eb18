"""What is timed: the convolution methods, each bound to one input set as a zero-argument call.

A method's `build(u, k, g, **terms)` returns the call a user makes: forward only when g is None,
else one training step (forward and the grads w.r.t. u, the filter and the terms). The terms are
the run's operator's other inputs (--operator gated: D, pregate, postgate; operators.py), and the
filter's shape is the operator's; a method without a form of the operator is unavailable. Setup
done in build (e.g. caching the filter spectrum) is not timed. A training step comes two ways,
one method each:
  `<name>`           torch.autograd.grad(y, (u, k, *terms), g): fresh gradient tensors every call;
  `<name>.backward`  y.backward(g) into the .grad of leaf tensors that keep their grads across
                     calls, so each call also adds into the existing .grad (gradient
                     accumulation, as an optimizer loop without zero_grad between micro-batches).
Every method takes and returns tensors of the run's I/O dtype. torch.fft transforms no bfloat16,
and float16 only at powers of two on a GPU, in float16's narrow range: with half-precision I/O
the torch.fft methods compute as users write them, the inputs cast up to float32 and the result
back (their description says so); the monarch methods take the half-precision tensors as they are.
Also the nominal flop count of the torch.fft methods; monarch methods take theirs from
monarch_fftconv.explain(). Rows are named for what runs on the device: torch.fft is cuFFT on a
GPU, MKL or pocketfft on the host (fft_library), so the tuned torch.fft method is `cufft-tuned`
on a GPU and e.g. `mkl-tuned` on a CPU.

A peer that cannot run here (`cudnn` with neither a cuDNN >= 9.26 frontend nor a kit, or on a CPU) is a
method with `unavailable` set, which the run reports as skipped, one line and a JSON entry,
instead of measuring it; one whose library rejects a shape's first call is skipped at that shape.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from fftconv_bench import REPO_ROOT, cudnn_capi
from fftconv_bench.operators import PLAIN, Operator


def _import_monarch():
    """The installed monarch_fftconv, else the one of the checkout this benchmark lives in."""
    try:
        import monarch_fftconv
    except ImportError:
        sys.path.append(str(REPO_ROOT))
        import monarch_fftconv
    return monarch_fftconv


mf = _import_monarch()
# The package's precision vocabulary and error budgets (the guard reads the budgets from here):
# imported after the fallback above, never restated in the benchmark.
from monarch_fftconv.planner import plan_for, real_fft_flops  # noqa: E402  (the one flop convention)
from monarch_fftconv.policy import ERROR_BUDGETS, PRECISIONS  # noqa: E402,F401

Tensor = torch.Tensor
# build(u, k, grad_y or None, **terms) -> zero-argument call; describe(u, k, **terms) ->
# explain()-like dict; flops(B, C, L, backward, description) -> flops of one call, or None.
Build = Callable[..., Callable[[], Any]]
Describe = Callable[..., Dict[str, Any]]
Flops = Callable[[int, int, int, bool, Dict[str, Any]], Optional[float]]


@dataclasses.dataclass
class Method:
    """One row of a shape's table: a convolution, forward only or as one kind of training step."""
    name: str                   # unique short id (CLI --methods, JSON, CSV)
    family: str                 # reference | cufft, mkl or pocketfft (tuned) | compile | monarch
    precision: Optional[str]    # requested precision (None: package default / not applicable)
    entry: str                  # what the call goes through, its precision aside
    build: Build                # forward calls return y; training steps (y, grad_u, grad_k, *terms')
    describe: Describe
    flops: Flops
    train_step: Optional[str] = None   # None (forward) or a key of TRAIN_STEPS
    unavailable: Optional[str] = None  # why it cannot run in this run (then skipped, with this)
    first_call: Optional[str] = None   # what its first call does that later ones don't (timed apart)
    skip_rejected: bool = False        # a first call its library refuses skips the shape, no error row


@dataclasses.dataclass
class Bound:
    """One convolution bound to one input set."""
    forward: Callable[[], Tensor]     # computes y from the bound inputs
    leaves: Tuple[Tensor, ...]        # what a training step differentiates: u, the filter, the terms


@dataclasses.dataclass
class Convolution:
    """A way of computing y, before it is made a forward-only or a training-step method."""
    name: str
    family: str
    precision: Optional[str]
    entry: str                  # methods with the same entry, backend and kernel run the same code
    bind: Callable[..., Bound]  # (u, k, training, **terms) -> Bound
    describe: Describe
    flops: Flops
    unavailable: Optional[str] = None
    first_call: Optional[str] = None
    skip_rejected: bool = False


# ----------------------------------------------------------------------------------- torch.fft

def reference_conv(u: Tensor, k: Tensor) -> Tensor:
    """The reference, exactly as commonly written (filter FFT every call, explicit padding)."""
    L = u.shape[-1]
    u_f = torch.fft.rfft(F.pad(u, (0, L)))
    k_f = torch.fft.rfft(F.pad(k, (0, L)))   # the benchmark uses Lk == L: both have n = 2L
    return torch.fft.irfft(u_f * k_f, n=2 * L)[..., :L]


def bidirectional_reference_conv(u: Tensor, k: Tensor) -> Tensor:
    """A (C, 2, L) filter's convolution as safari and Monarch Mixer write it: one spectrum,
    the causal half's plus the conjugate of the anti-causal half's (its taps at negative lags)."""
    L = u.shape[-1]
    k_f = torch.fft.rfft(k[:, 0], n=2 * L) + torch.fft.rfft(k[:, 1], n=2 * L).conj()
    return torch.fft.irfft(torch.fft.rfft(u, n=2 * L) * k_f, n=2 * L)[..., :L]


def reference_operator(u: Tensor, k: Tensor, D: Optional[Tensor] = None,
                       pregate: Optional[Tensor] = None, postgate: Optional[Tensor] = None) -> Tensor:
    """The reference for the Hyena operators, as users write them in torch.fft today:
    x = pregate ⊙ u; a grouped filter repeated over its channels (repeat_interleave); then
    postgate ⊙ (conv(x, k) + D ⊙ x)."""
    x = u if pregate is None else pregate * u
    if k.shape[0] != x.shape[-2]:
        k = k.repeat_interleave(x.shape[-2] // k.shape[0], 0)
    y = bidirectional_reference_conv(x, k) if k.dim() == 3 else reference_conv(x, k)
    if D is not None:
        y = y + D.unsqueeze(-1) * x
    return y if postgate is None else postgate * y


def filter_spectrum(k: Tensor, n: int) -> Tensor:
    """rfft(k, n) of a (G, L) filter bank; of a bidirectional (G, 2, L) one, both halves' in one,
    rfft(k[:, 0], n) + conj(rfft(k[:, 1], n))."""
    if k.dim() == 3:
        return torch.fft.rfft(k[:, 0], n=n) + torch.fft.rfft(k[:, 1], n=n).conj()
    return torch.fft.rfft(k, n=n)


def spectrum_operator(u: Tensor, k_f: Tensor, D: Optional[Tensor] = None,
                      pregate: Optional[Tensor] = None, postgate: Optional[Tensor] = None) -> Tensor:
    """The operator from the filter spectrum k_f (G, L+1): rfft(x, n=2L) without explicit
    padding, times the spectrum (G < C: each group's channels broadcast their filter's row, no
    copy), irfft, the first L; the gates and D around it as in reference_operator."""
    x = u if pregate is None else pregate * u
    L = x.shape[-1]
    x_f = torch.fft.rfft(x, n=2 * L)
    groups = k_f.shape[0]
    if groups == x.shape[-2]:
        y_f = x_f * k_f
    else:
        y_f = (x_f.unflatten(-2, (groups, -1)) * k_f.unsqueeze(-2)).flatten(-3, -2)
    y = torch.fft.irfft(y_f, n=2 * L)[..., :L]
    if D is not None:
        y = y + D.unsqueeze(-1) * x
    return y if postgate is None else postgate * y


def per_call_spectrum_operator(u: Tensor, k: Tensor, **terms: Tensor) -> Tensor:
    """spectrum_operator with the filter transformed in the call."""
    return spectrum_operator(u, filter_spectrum(k, 2 * u.shape[-1]), **terms)


def torch_fft_flops(B: int, C: int, L: int, *, filter_fft: bool, backward: bool) -> float:
    """Nominal flops of the torch.fft convolution with FFT size N = 2L.

    forward:  per row (B·C rows): rfft(u) + irfft = 2 real FFTs, plus 6 flops per complex
              multiply over N/2+1 bins; per channel: rfft(k) when the filter spectrum is not
              cached (filter_fft=True).
    backward: per row: rfft(grad_y) + irfft for grad_u = 2 real FFTs, 2 complex multiplies per
              bin (grad_u and grad_k spectra); reduction of grad_k over the batch (2 flops per
              bin per extra batch entry); per channel: irfft for grad_k; with a per-call filter
              FFT, that's the one transform the backward of rfft(k) needs.
    """
    N = 2 * L
    bins = N // 2 + 1
    rows = B * C
    flops = rows * (2 * real_fft_flops(N) + 6 * bins)
    if filter_fft:
        flops += C * real_fft_flops(N)
    if backward:
        flops += rows * (2 * real_fft_flops(N) + 2 * 6 * bins) + 2 * bins * (B - 1) * C
        flops += C * real_fft_flops(N)
    return flops


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> 'bfloat16' (as --io-dtype names it)."""
    return str(dtype).removeprefix("torch.")


def is_half(t: Tensor) -> bool:
    return t.dtype in (torch.bfloat16, torch.float16)


def _float32(t: Tensor) -> Tensor:
    return t.float() if is_half(t) else t   # (a cached spectrum, complex64, stays as it is)


def in_float32(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """fn for half-precision tensors, as users write it for torch.fft: computed in float32,
    the result cast back to u's dtype (differentiable: the grads come back cast down)."""
    def upcast(u: Tensor, k: Tensor, **terms: Tensor) -> Tensor:
        return fn(_float32(u), _float32(k),
                  **{name: _float32(t) for name, t in terms.items()}).to(u.dtype)
    return upcast


def _leaf(t: Tensor) -> Tensor:
    """A leaf requiring grad that shares the buffer's storage (no extra copy)."""
    return t.detach().requires_grad_(True)


def bind_function(fn: Callable[..., Tensor]) -> Callable[..., Bound]:
    """bind(u, k, training, **terms) for y = fn(u, k, **terms); training binds leaves
    requiring grad."""
    def bind(u: Tensor, k: Tensor, training: bool, **terms: Tensor) -> Bound:
        if training:
            u, k = _leaf(u), _leaf(k)
            terms = {name: _leaf(t) for name, t in terms.items()}
        return Bound(lambda: fn(u, k, **terms), (u, k, *terms.values()))
    return bind


def bind_torch_fft(fn: Callable[..., Tensor]) -> Callable[..., Bound]:
    """bind_function for a torch.fft computation: half-precision I/O is computed in float32
    (chosen here, so that a float32 call runs fn itself)."""
    def bind(u: Tensor, k: Tensor, training: bool, **terms: Tensor) -> Bound:
        return bind_function(in_float32(fn) if is_half(u) else fn)(u, k, training, **terms)
    return bind


def _bind_tuned(u: Tensor, k: Tensor, training: bool, **terms: Tensor) -> Bound:
    if training:   # the filter spectrum needs a gradient, so it is computed per call
        return bind_torch_fft(per_call_spectrum_operator)(u, k, True, **terms)
    k_f = filter_spectrum(k.float(), 2 * u.shape[-1])   # cached: outside the timed call
    conv = in_float32(spectrum_operator) if is_half(u) else spectrum_operator
    return Bound(lambda: conv(u, k_f, **terms), (u, k, *terms.values()))


def _bind_compiled(fn: Callable[..., Tensor]) -> Callable[..., Bound]:
    compiled: Dict[bool, Callable] = {}   # by half-precision I/O: the casts are in the graph

    def bind(u: Tensor, k: Tensor, training: bool, **terms: Tensor) -> Bound:
        half = is_half(u)
        if half not in compiled:
            # Static shapes: each swept shape gets its own specialised graph (dynamo would
            # otherwise switch to a dynamic-shape graph at the second shape).
            try:
                import torch._dynamo as dynamo
                for knob in ("recompile_limit", "cache_size_limit"):
                    if hasattr(dynamo.config, knob):
                        setattr(dynamo.config, knob, max(64, getattr(dynamo.config, knob)))
            except Exception:  # noqa: BLE001
                pass
            compiled[half] = torch.compile(in_float32(fn) if half else fn, dynamic=False)
        return bind_function(compiled[half])(u, k, training, **terms)
    return bind


# ----------------------------------------------------------------------------- monarch_fftconv

def _bind_module(u: Tensor, k: Tensor, training: bool) -> Bound:
    B, C, L = u.shape
    # the filter in the I/O dtype, as every other method takes it (a float32 one read twice the bytes)
    module = mf.FFTConv(C, L, groups=k.shape[0], bidirectional=k.dim() == 3).to(device=u.device, dtype=k.dtype)
    with torch.no_grad():
        module.filter.copy_(k.reshape(module.filter.shape))
    if training:
        u = _leaf(u)
        return Bound(lambda: module(u), (u, module.filter))

    # Serving: one inference_cache() block held open for this binding's life (its filter is never
    # written), so the spectrum is computed by the warm-up's first call, not by the timed ones.
    block = contextlib.ExitStack()
    block.enter_context(mf.inference_cache(module))

    def inference(_block=block):  # the closure keeps the block open
        with torch.no_grad():
            return module(u)
    return Bound(inference, (u, module.filter))


def _monarch_flops(B: int, C: int, L: int, backward: bool, info: Dict[str, Any]) -> Optional[float]:
    forward = info.get("flops")
    if forward is None:
        return None
    if backward:   # explain() describes one forward call; count backward only if the package says
        bwd = info.get("flops_backward")
        return None if bwd is None else float(forward) + float(bwd)
    return float(forward)


def _explain(precision: Optional[str], operator: Operator = PLAIN) -> Describe:
    options = {"bidirectional": True} if operator.bidirectional else {}

    def describe(u: Tensor, k: Tensor, **terms: Tensor) -> Dict[str, Any]:
        try:
            info = mf.explain(u, k, precision=precision, **options, **terms)
            return dict(info) if isinstance(info, dict) else {"backend": str(info)}
        except Exception as e:  # noqa: BLE001
            return {"backend": "?", "precision": precision,
                    "explain_error": f"{type(e).__name__}: {e}"}
    return describe


# ---------------------------------------------------------------------------- training steps

def grad_step(bound: Bound, grad_y: Tensor) -> Callable[[], Any]:
    """y, then torch.autograd.grad(y, (u, k, *terms), grad_y): fresh grads, nothing
    accumulated. Returns (y, grad_u, grad_k, *the terms' grads)."""
    def call():
        y = bound.forward()
        return (y, *torch.autograd.grad(y, bound.leaves, grad_y))
    return call


def accumulate_step(bound: Bound, grad_y: Tensor) -> Callable[[], Any]:
    """y, then y.backward(grad_y): the grads add into the leaves' .grad, kept across calls.
    Returns (y, *the leaves' .grad), which hold the true grads after the first call only."""
    def call():
        y = bound.forward()
        y.backward(grad_y)
        return (y, *(leaf.grad for leaf in bound.leaves))
    return call


# train_step key -> (method name suffix, step builder)
TRAIN_STEPS: Dict[str, Tuple[str, Callable[[Bound, Tensor], Callable[[], Any]]]] = {
    "autograd.grad": ("", grad_step),
    "backward+accumulate": (".backward", accumulate_step),
}


def as_method(conv: Convolution, train_step: Optional[str] = None) -> Method:
    """The forward-only method of `conv` (train_step None), or one of its training steps."""
    suffix, make_step = TRAIN_STEPS[train_step] if train_step else ("", None)

    def build(u: Tensor, k: Tensor, grad_y: Optional[Tensor], **terms: Tensor) -> Callable[[], Any]:
        if grad_y is None or make_step is None:
            return conv.bind(u, k, False, **terms).forward
        return make_step(conv.bind(u, k, True, **terms), grad_y)
    return Method(conv.name + suffix, conv.family, conv.precision, conv.entry, build,
                  conv.describe, conv.flops, train_step, conv.unavailable, conv.first_call,
                  conv.skip_rejected)


def _nominal(backend: str, kernel: str) -> Describe:
    def describe(u: Tensor, k: Tensor, **terms: Tensor) -> Dict[str, Any]:
        info = {"backend": backend, "kernel": kernel, "precision": "fp32"}
        if is_half(u):
            info["reason"] = (f"torch.fft transforms no bfloat16 (float16 only at powers of two, "
                              f"on a GPU): the {dtype_name(u.dtype)} inputs are cast to float32 and y "
                              f"back, as users write it")
        return info
    return describe


def _torch_fft_flops(filter_fft_forward: bool, operator: Operator) -> Flops:
    if operator is not PLAIN:   # torch_fft_flops counts the plain convolution only
        return lambda *args: None
    # A per-call filter FFT in training either way: its gradient is needed.
    return lambda B, C, L, bwd, info: torch_fft_flops(B, C, L, filter_fft=filter_fft_forward or bwd,
                                                  backward=bwd)


def fft_library(device: str) -> str:
    """What torch.fft runs on `device`: cuFFT on a GPU; on the host MKL where torch was built
    with it (x86 wheels), pocketfft otherwise."""
    if device == "cuda":
        return "cuFFT"
    return "MKL" if torch.backends.mkl.is_available() else "pocketfft"


def convolutions(device: str, *, compile: bool = False,
                 operator: Operator = PLAIN) -> List[Convolution]:
    """Every way of computing y that the run compares on `device`, in table order; those with
    no form of `operator` unavailable, saying why."""
    library = fft_library(device)
    tuned = library.lower()

    def lacks_operator(why: str, lacking: bool = operator is not PLAIN) -> Optional[str]:
        return f"no --operator {operator.name} form: {why}" if lacking else None

    reference = reference_conv if operator is PLAIN else reference_operator
    written = "" if operator is PLAIN else f", the {operator.name} operator as users write it"
    convs = [
        Convolution("reference", "reference", None, reference.__name__, bind_torch_fft(reference),
                    _nominal("torch.fft", f"{library} rfft+irfft, padded{written}"),
                    _torch_fft_flops(True, operator)),
        Convolution(f"{tuned}-tuned", tuned, None, "tuned torch.fft", _bind_tuned,
                    _nominal("torch.fft", f"{library} rfft(n=2L) + cached filter spectrum{written}"),
                    _torch_fft_flops(False, operator)),
    ]
    if compile:
        convs.append(Convolution("compile-reference", "compile", None,
                                 f"torch.compile({reference.__name__})", _bind_compiled(reference),
                                 _nominal("torch.compile", f"inductor(reference){written}"),
                                 _torch_fft_flops(True, operator),
                                 first_call="compiles the graph for the shape: made before the "
                                            "warm-up, left out of every timing (first_call_s)"))
    options = {"bidirectional": True} if operator.bidirectional else {}
    for p in PRECISIONS:
        fftconv_p = (lambda p: lambda u, k, **terms: mf.fftconv(u, k, precision=p, **options,
                                                                 **terms))(p)
        convs.append(Convolution(f"monarch[{p}]", "monarch", p, "monarch_fftconv.fftconv",
                                 bind_function(fftconv_p), _explain(p, operator), _monarch_flops))
    convs.append(Convolution("monarch-module", "monarch", None, "monarch_fftconv.FFTConv",
                             _bind_module, _explain(None, operator), _monarch_flops,
                             unavailable=lacks_operator("FFTConv takes no gates or D (monarch[p] "
                                                        "times them)", operator.gated)))
    convs.append(cudnn_convolution(device, lacks_operator(
        "cudnn.ops.fft_causal_conv1d takes one causal filter per channel, no gates or D")))
    # the CUDA backward's switches, each beside the default: (name, entry, switch, value, route)
    backward_switched = [
        ("monarch-scratch-grad", "fftconv_op + scratch-route backward", GRAD_ACCUMULATOR_ENV, "global",
         "the scratch route"),
        ("monarch-fused-grad", "fftconv_op + one fused grad kernel (N = 32768)", GRAD_SPLIT_ENV, "0",
         "the fused grad kernel"),
        ("monarch-batch-sum", "fftconv_op + the four-step products summed by batch_sum (N >= 65536)",
         SUM_IN_GRAD_ENV, "0", "the four-step batch_sum"),
    ]
    for name, entry, switch, value, route in backward_switched:
        convs.append(Convolution(name, "monarch", "fp32", entry, bind_function(_backward_switched(switch, value)),
                                 _explain("fp32", operator), _monarch_flops,
                                 unavailable=lacks_operator("a causal filter per channel, no gates or D")
                                 or (None if device == "cuda" else f"{route} is the CUDA backward's")))
    convs.append(Convolution("monarch-keep-spectrum", "monarch", "fp32",
                             "fftconv keeping u's spectrum for the backward (N >= 65536)",
                             bind_function(_fftconv_switched(KEEP_SPECTRUM_ENV, "1", "fp32", os.environ)),
                             _explain("fp32", operator), _monarch_flops,
                             unavailable=lacks_operator("the plain op's autograd keeps it")
                             or (None if device == "cuda" else "the CUDA autograd keeps it")))
    switched = [("monarch-grouped-repeat", "the G filter rows repeated to one a channel before the ops",
                 "GROUPS_IN_KERNELS", False, "grouped",
                 operator.name != "grouped", "fp32"),
                ("monarch-aten-gates", "fftconv_op with ATen gates around it", "FUSED_GATES", False, "gated",
                 not operator.gated, "fp32"),
                # the training step the fused one replaced (session 22): differs from monarch[fp32]
                # only where autograd records the call (--backward)
                ("monarch-unfused-gated-train", "fftconv with ATen gates around the kernels in a training step",
                 "FUSED_GATED_TRAINING", False, "gated", not operator.gated, "fp32"),
                # the switch written in session 39 (off): dpostgate = dy ⊙ z in the gated grad
                # kernel; differs from monarch[fp32] only in a gated training step (--backward)
                ("monarch-dpostgate-in-grad", "fftconv, the fused gated step's dpostgate in its grad kernel",
                 "DPOSTGATE_IN_GRAD_KERNEL", True, "gated", not operator.gated, "fp32")]
    # the route a half-precision gated call took before GATED_CALLS_ON_FP32 (session 28): the
    # tensor cores with ATen gates around them
    switched += [(f"monarch-tc-gates[{p}]", "fftconv on the tensor cores with ATen gates around them",
                  "GATED_CALLS_ON_FP32", False, "gated", not operator.gated, p) for p in ("bf16", "fp16")]
    for name, entry, switch, value, kind, lacking, p in switched:
        convs.append(Convolution(name, "monarch", p, entry, bind_function(_fftconv_switched(switch, value, p)),
                                 _explain_switched(p, operator, switch, value), _monarch_flops,
                                 unavailable=lacks_operator(f"the {kind} operator's switch", lacking)))
    for p in TENSOR_CORE_PRECISIONS:
        convs.append(Convolution(f"monarch-tc[{p}]", "monarch", p, "monarch_fftconv.ops.fftconv_op",
                                 _bind_tensor_core(p), _describe_tensor_core(p), _monarch_flops,
                                 unavailable=lacks_operator("the op takes one causal filter per "
                                                            "channel, no gates or D")))
    return convs


# ----------------------------------------------------------------------------- cuDNN (issue #32)

# The production peer: cuDNN's FFT causal convolution, y[t] = Σ_j weight[j]·x[t−j] over x (B, C, L)
# and weight (C, K) of one dtype, through the frontend's torch wrapper (it pads lengths that are
# not powers of two itself, and is differentiable by torch.autograd), else through the C API of a
# kit (cudnn_capi.fft_causal_conv1d, which does the same). cuDNN 9.26.0 is the first
# with it; backend_version() encodes major·10000 + minor·100 + patch.
CUDNN_MIN_VERSION = 92600
CUDNN_INSTALL = "pip install nvidia-cudnn-cu13 nvidia-cudnn-frontend"
CUDNN_DEVICES = ("cuda",)   # where cuDNN runs (a test widens it to run its CPU double)
# The C API's route (cudnn_capi), where the frontend cannot run: the kit folder it loads.
CUDNN_KIT_ENV = "MONARCH_FFTCONV_CUDNN_KIT"
CUDNN_CAPI_ENTRY = "cudnnFFTCausalConv1d C API (ctypes)"
CUDNN_FIRST_CALL = ("JIT-compiles cuDNN's kernels for the shape (8-42 s): made before the warm-up, "
                    "left out of every timing (first_call_s)")


def cudnn_version_name(version: int) -> str:
    """92600 -> '9.26.0'."""
    return f"{version // 10000}.{version // 100 % 100}.{version % 100}"


def load_cudnn(device: str) -> Tuple[Any, Optional[str]]:
    """(cuDNN's frontend module, None) when it can run the FFT causal convolution on `device`,
    else (None, why not): never raises, so that a missing peer costs a line, not the run."""
    if device not in CUDNN_DEVICES:
        return None, f"cuDNN runs on CUDA devices only, this run is on {device}"
    try:
        import cudnn
    except ImportError as e:   # "No module named 'cudnn'"
        return None, f"{str(e)[:1].lower()}{str(e)[1:]}; {CUDNN_INSTALL}"
    except Exception as e:  # noqa: BLE001 -- e.g. a libcudnn the module cannot load
        return None, f"import cudnn failed ({type(e).__name__}: {e}); {CUDNN_INSTALL}"
    try:
        version = int(cudnn.backend_version())
    except Exception as e:  # noqa: BLE001
        return None, f"cudnn.backend_version() failed ({type(e).__name__}: {e}); {CUDNN_INSTALL}"
    if version < CUDNN_MIN_VERSION:
        return None, (f"cuDNN {cudnn_version_name(version)} is older than "
                      f"{cudnn_version_name(CUDNN_MIN_VERSION)}, the first with the FFT causal "
                      f"convolution; pip install -U nvidia-cudnn-cu13")
    if not callable(getattr(getattr(cudnn, "ops", None), "fft_causal_conv1d", None)):
        return None, ("this nvidia-cudnn-frontend has no cudnn.ops.fft_causal_conv1d; "
                      "pip install -U nvidia-cudnn-frontend")
    return cudnn, None


def load_cudnn_capi() -> Tuple[Optional[cudnn_capi.FFTCausalConv1dLibrary], Optional[str]]:
    """(the C API of the kit that MONARCH_FFTCONV_CUDNN_KIT names, None), else (None, why not):
    never raises."""
    kit = os.environ.get(CUDNN_KIT_ENV)
    if not kit:
        return None, (f"or set {CUDNN_KIT_ENV} to a cuDNN >= 9.26 kit folder (lib/libcudnn_ext.so.9, "
                      f"include/; ../shared/tools/cudnn_kit.sh) to call its C API")
    try:
        return cudnn_capi.open_kit(kit), None
    except Exception as e:  # noqa: BLE001 -- e.g. a missing file or function
        return None, f"{CUDNN_KIT_ENV}={kit}: {type(e).__name__}: {e}"


def _cudnn_method(entry: str, bind: Callable[..., Bound], describe: Describe,
                  unavailable: Optional[str] = None) -> Convolution:
    return Convolution("cudnn", "cudnn", None, entry, bind, describe, lambda *args: None,
                       unavailable=unavailable, first_call=CUDNN_FIRST_CALL, skip_rejected=True)


def _unavailable_cudnn(why: str) -> Convolution:
    """The cudnn method where it cannot run: skipped by the run, saying `why`."""
    def bind(u: Tensor, k: Tensor, training: bool) -> Bound:
        raise RuntimeError(f"cudnn cannot run here: {why}")

    def describe(u: Tensor, k: Tensor, **terms: Tensor) -> Dict[str, Any]:
        return {"backend": "cuDNN", "kernel": None, "precision": None}
    return _cudnn_method("cuDNN FFT causal conv1d", bind, describe, why)


def _frontend_convolution(cudnn: Any) -> Convolution:
    def bind(u: Tensor, k: Tensor, training: bool) -> Bound:
        return bind_function(lambda x, weight: cudnn.ops.fft_causal_conv1d(x, weight))(u, k, training)

    def describe(u: Tensor, k: Tensor, **terms: Tensor) -> Dict[str, Any]:
        version = cudnn_version_name(int(cudnn.backend_version()))
        return {"backend": "cuDNN", "kernel": f"cudnn.ops.fft_causal_conv1d (cuDNN {version})",
                "precision": None}
    return _cudnn_method("cudnn.ops.fft_causal_conv1d", bind, describe)


def _capi_convolution(library: cudnn_capi.FFTCausalConv1dLibrary) -> Convolution:
    def bind(u: Tensor, k: Tensor, training: bool) -> Bound:
        return bind_function(lambda x, weight: cudnn_capi.fft_causal_conv1d(library, x, weight))(
            u, k, training)

    def describe(u: Tensor, k: Tensor, **terms: Tensor) -> Dict[str, Any]:
        kernel_size = cudnn_capi.kernel_size_for(u.shape[-1])
        path = cudnn_capi.path_for(kernel_size, cudnn_capi.medium_max_kernel(u.device))
        functions = "cudnnFFTCausalConv1d*" if path == "medium" else "cudnnLongFFTCausalConv1d*"
        return {"backend": "cuDNN", "precision": None,
                "kernel": f"{functions} ({path} path, K={kernel_size}) of {library.path}"}
    return _cudnn_method(CUDNN_CAPI_ENTRY, bind, describe)


def cudnn_convolution(device: str, lacks_operator: Optional[str] = None) -> Convolution:
    """The cudnn method: cuDNN's FFT causal convolution of u by k as a user calls it (the tensors
    in the I/O dtype as they are), through cudnn.ops.fft_causal_conv1d where the frontend runs
    it, else through the C API of the kit MONARCH_FFTCONV_CUDNN_KIT names (cudnn_capi: a kit
    folder with lib/libcudnn_ext.so.9 of cuDNN >= 9.26 and include/, as
    ../shared/tools/cudnn_kit.sh builds; benchmarks/gpu_setup.sh unpacks a carried .cudnn_kit/
    and sets it). Where neither can run (or cuDNN has no form of the run's operator:
    `lacks_operator` says why), the method with why not."""
    if lacks_operator:
        return _unavailable_cudnn(lacks_operator)
    cudnn, frontend_refused = load_cudnn(device)
    if cudnn is not None:
        return _frontend_convolution(cudnn)
    if device not in CUDNN_DEVICES:
        return _unavailable_cudnn(frontend_refused)
    library, capi_refused = load_cudnn_capi()
    if library is not None:
        return _capi_convolution(library)
    return _unavailable_cudnn(f"{frontend_refused}; {capi_refused}")


# The tensor-core kernels themselves, through the op, which runs the precision it is given:
# `fftconv` sends calls where the fp32 kernel measured faster to the fp32 kernel (tf32 always,
# bf16/fp16 on calls that fill the GPU), so `monarch[bf16]` times what a user gets and
# `monarch-tc[bf16]` the tensor-core kernel (issue #10's figure). Run only when --methods names them.
TENSOR_CORE_PRECISIONS = ("bf16", "fp16", "tf32")
# Rows run only when --methods names them: the tensor-core op, and the switches' routes beside
# the defaults (the fp32 backward's scratch route, the fused gates, the ops on grouped rows).
ON_REQUEST_PREFIXES = ("monarch-tc[", "monarch-scratch-grad", "monarch-fused-grad", "monarch-batch-sum",
                       "monarch-keep-spectrum",
                       "monarch-aten-gates", "monarch-grouped-repeat", "monarch-unfused-gated-train", "monarch-tc-gates[",
                       "monarch-dpostgate-in-grad")
# Read by the binding at each backward call.
GRAD_ACCUMULATOR_ENV = "MONARCH_FFTCONV_GRAD_ACCUMULATOR"
GRAD_SPLIT_ENV = "MONARCH_FFTCONV_GRAD_SPLIT"
# Read by the binding at each training forward (the four-step sizes: u's spectrum kept for the backward).
KEEP_SPECTRUM_ENV = "MONARCH_FFTCONV_KEEP_SPECTRUM"
# Read by the binding at each four-step backward (the batch summed in the grad kernel).
SUM_IN_GRAD_ENV = "MONARCH_FFTCONV_FOURSTEP_SUM_IN_GRAD"


@contextlib.contextmanager
def _set(owner: Any, name: str, value: Any):
    """owner.name = value (an attribute, or a key of os.environ) for the block only."""
    if owner is os.environ:
        before = os.environ.get(name)
        os.environ[name] = value
    else:
        before = getattr(owner, name)
        setattr(owner, name, value)
    try:
        yield
    finally:
        if owner is not os.environ:
            setattr(owner, name, before)
        elif before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def _fftconv_switched(switch: str, value: Any, precision: str = "fp32", owner: Any = mf.backends
                      ) -> Callable[..., Tensor]:
    """monarch[precision] with the switch owner.<switch> (a module attribute of backends, or a variable
    of os.environ) set to value for each call, timed beside the default: the binding's
    MONARCH_FFTCONV_KEEP_SPECTRUM=1 (read when the autograd records the call: u's four-step
    spectrum kept from the forward for the backward, which reads it from the graph), or
    GROUPS_IN_KERNELS off (the G filter rows repeated to one a channel before the ops, the route
    the grouped ops replaced; the repeat's gradient, each group's sum, is autograd's), FUSED_GATES off (a forward that records no gradient keeps the ATen gates
    around the kernel, the route the fused gates replaced), FUSED_GATED_TRAINING off (a call that
    records a gradient keeps the ATen gates around the fp32 forward and grad kernels; its
    backward follows the forward's route, so the switch is set there only), DPOSTGATE_IN_GRAD_KERNEL
    on (read at the forward too: the fused gated step's dpostgate in its grad kernel), or
    GATED_CALLS_ON_FP32 off (a bf16/fp16 gated call on the tensor cores, its gates ATen passes
    around them)."""
    def fftconv(u: Tensor, k: Tensor, **terms: Tensor) -> Tensor:
        with _set(owner, switch, value):
            return mf.fftconv(u, k, precision=precision, **terms)
    return fftconv


def _explain_switched(precision: str, operator: Operator, switch: str, value: bool) -> Describe:
    """_explain(precision, operator) with backends.<switch> = value while it asks, so that the row
    names the route it times."""
    describe = _explain(precision, operator)

    def explain(u: Tensor, k: Tensor, **terms: Tensor) -> Dict[str, Any]:
        with _set(mf.backends, switch, value):
            return describe(u, k, **terms)
    return explain


def _backward_switched(name: str, value: str) -> Callable[..., Tensor]:
    """monarch[fp32]'s forward op, and its backward op with the binding's switch `name` = value
    set around the call only, timed beside the default: the per-channel sums in the global
    scratch (MONARCH_FFTCONV_GRAD_ACCUMULATOR=global, the route the on-chip accumulator
    replaced), or the one fused grad kernel at N = 32768 (MONARCH_FFTCONV_GRAD_SPLIT=0: the route
    the split backward replaced, du and the filter sums in one kernel), or the four-step products
    summed over the batch by their own kernel (MONARCH_FFTCONV_FOURSTEP_SUM_IN_GRAD=0: the route
    the grad kernel's own sum replaced)."""

    class SwitchedBackwardConv(torch.autograd.Function):
        @staticmethod
        def forward(ctx, u: Tensor, k: Tensor) -> Tensor:
            y, spectrum = mf.ops.fftconv_op(u, k, None, "fp32")
            ctx.save_for_backward(u, spectrum)
            ctx.filter_len = k.shape[-1]
            return y

        @staticmethod
        def backward(ctx, grad: Tensor):
            u, spectrum = ctx.saved_tensors
            with _set(os.environ, name, value):
                du, dk, _ = mf.ops.fftconv_backward_op(grad.contiguous(), u, spectrum, None, ctx.filter_len, "fp32")
            return du, dk

    return SwitchedBackwardConv.apply


def _bind_tensor_core(precision: str) -> Callable[..., Bound]:
    bind = bind_function(lambda u, k: mf.ops.fftconv_op(u, k, None, precision)[0])

    def bind_loaded(u: Tensor, k: Tensor, training: bool) -> Bound:
        if u.is_cuda:
            mf._extension.coverage()  # the op's CUDA kernels: loaded here, outside the timed calls
        return bind(u, k, training)
    return bind_loaded


def _describe_tensor_core(precision: str) -> Describe:
    """explain()'s description, except where explain() names the fp32 kernel only because
    fp32_kernel_is_faster routes the call there: the op runs the tensor-core kernel, whose name
    and flops the row then carries."""
    def describe(u: Tensor, k: Tensor, **terms: Tensor) -> Dict[str, Any]:
        info = _explain(precision)(u, k)
        plan = plan_for(u.shape[-1])
        if info.get("reason") == mf.backends.fp32_kernel_is_faster(precision, True, plan.fft_size):
            channels = u.shape[-2]
            batch = u.numel() // (channels * u.shape[-1])
            kernel = mf.backends.tensor_core_backend(plan, precision, u.dtype, batch * channels)  # the op's kernel
            info.update(kernel=kernel.kernel, reason=f"{kernel.reason}, through the op ({info['reason']})",
                        flops=kernel.flops(plan, batch, channels),
                        stages=kernel.stages(plan, batch, channels, u.element_size()))
        info.update(backend="tc-op", precision=precision)
        return info
    return describe


def make_methods(device: str, *, compile: bool = False, backward: bool = False,
                 only: Optional[Sequence[str]] = None, operator: Operator = PLAIN) -> List[Method]:
    """All methods of a run on `device`, in table order (--methods `only` keeps that order):
    forward only, or with `backward` each convolution's training step by autograd.grad, then
    all by y.backward with accumulation. A method that cannot run here is in the list, its
    `unavailable` saying why: the run reports it as skipped."""
    convs = convolutions(device, compile=compile, operator=operator)
    if backward:
        methods = [as_method(c, step) for step in TRAIN_STEPS for c in convs]
    else:
        methods = [as_method(c) for c in convs]
    if only:
        unknown = set(only) - {m.name for m in methods}
        if unknown:
            raise SystemExit(f"unknown method(s) {sorted(unknown)}; "
                             f"known: {[m.name for m in methods]}")
        methods = [m for m in methods if m.name in set(only)]
    else:
        methods = [m for m in methods if not m.name.startswith(ON_REQUEST_PREFIXES)]
    return methods
