"""`FFTConv`: a drop-in nn.Module for the long convolution of SSM layers,
`inference_cache`: the explicit, scoped filter-spectrum cache for serving, and
`HyenaOperator` (hyena.py): the Hyena operator on `fftconv`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from . import functional, generation, policy
from .backends import Backend
from .ops import bits as _bits
from .planner import compute_dtype
from .hyena import HyenaOperator

__all__ = ["FFTConv", "HyenaOperator", "inference_cache"]

_MODULE_NAMES = functional.ArgNames(u="the input", k="the filter", D="D")


class FFTConv(nn.Module):
    """y = causal_conv(x, filter) over the last dim, per channel.

    Args:
        channels: C, the number of channels.
        seq_len: the longest input length L; also the filter length.
        groups: G, the number of filters, dividing C: channel c takes filter c // (C // G).
            None (the default): one filter per channel.
        bidirectional: False, or filters of shape (G, 2, seq_len), [:, 0] causal and [:, 1]
            anti-causal, in the convention named: "fftconv_ref" (or True) or "m2", as `fftconv`
            defines them.
        precision: "fp32", "tf32", "bf16", "fp16", or None to follow the precision policy
            (a `monarch_fftconv.precision()` block, the environment, the input's dtype).
        device, dtype: of the `filter` parameter.

    By default the same parameter (`filter`, shape (channels, seq_len), randn init) as the plain
    torch.fft model it replaces, so its state_dict loads as is. Inputs may be shorter than seq_len.

    Every call computes the filter spectrum from the parameter as it is at that call, so no
    write to the filter, by any route, can leave a call with an old one. For serving,
    `inference_cache(model)` keeps the spectra between calls and recomputes one only where the
    filter changed (compared at every call).
    """

    def __init__(
        self, channels: int, seq_len: int, *, groups: int | None = None, bidirectional: bool | str = False,
        precision: str | None = None, device=None, dtype=None,
    ):
        super().__init__()
        for name, value in (("channels", channels), ("seq_len", seq_len)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        convention = functional.bidirectional_convention(bidirectional)  # ValueError on another value
        if precision is not None:
            policy.check_precision(precision)
        groups = channels if groups is None else groups
        if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1 or channels % groups:
            raise ValueError(f"groups must be a positive divisor of channels={channels}, got {groups!r}")
        self.channels, self.seq_len, self.groups = channels, seq_len, groups
        self.bidirectional = convention or False  # False, "fftconv_ref" or "m2"
        self.precision = precision
        shape = (groups, 2, seq_len) if bidirectional else (groups, seq_len)
        self.filter = nn.Parameter(torch.randn(shape, device=device, dtype=dtype))
        self._spectra: _SpectrumCache | None = None  # set inside an inference_cache() block only

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, C, L), (C, L) or (..., C, L) with L <= seq_len; returns y of x's shape and
        dtype, y[..., c, t] = Σ_{s<=t} filter[c // (C // G), s]·x[..., c, t-s] (bidirectional:
        plus the anti-causal half, as `fftconv` defines it). The channel count must be the
        module's: grouping comes from `groups`, never from the input."""
        if not isinstance(x, Tensor) or x.dim() < 2 or x.shape[-2] != self.channels:
            raise self._input_error(x)
        length = x.shape[-1]
        if length > self.seq_len:
            raise ValueError(f"input length {length} exceeds the module's seq_len {self.seq_len}: the input must have "
                             f"shape (..., {self.channels}, L) with L <= {self.seq_len}, got {tuple(x.shape)}")
        filt = self.filter if length == self.seq_len else self.filter[..., :length]
        # A compiled graph computes the spectrum itself and never reads the cache state: a guard
        # on it would recompile the graph at every inference_cache() block.
        cached = None if torch.compiler.is_compiling() or self._spectra is None else self._spectra.spectrum
        return functional.conv(x, filt, None, None, self.precision, cached, _MODULE_NAMES,
                               bidirectional=self.bidirectional)

    def _input_error(self, x: object) -> Exception:
        if not isinstance(x, Tensor):
            return TypeError(f"the input must be a torch.Tensor, got {type(x).__name__}")
        shape = tuple(x.shape)
        hint = ""
        if x.dim() >= 2 and shape[-1] == self.channels:
            hint = "; it looks like (B, L, C): the module takes (B, C, L), e.g. x.transpose(-1, -2)"
        return ValueError(f"the input must have shape (B, {self.channels}, L) or (..., {self.channels}, L) with "
                          f"L <= {self.seq_len} (FFTConv channels={self.channels}), got {shape}{hint}")

    def prefill(self, x: Tensor, max_len: int, *, cuda_graph: bool = False) -> tuple[Tensor, generation.ConvState]:
        """Start generating: x the prompt (B, C, P), 0 <= P <= max_len <= seq_len. Returns
        (y, state): y = self(x), the ordinary call; `state` for `step` at positions
        P .. max_len - 1. The state holds values derived from the filter as it is now (block
        spectra, the prompt's contribution): step uses that filter, like a KV cache, and
        raises RuntimeError if `filter` was replaced, converted, written in place or stepped
        by a torch.optim optimizer since (an in-place `.data` write goes unseen: step then
        keeps the prefill's filter). Bidirectional layers raise ValueError.
        cuda_graph=True (CUDA only) captures the steps as CUDA graphs here, one per block level:
        a step is then one copy and one graph launch, its y_t a view of the state's output
        history (15 steps in 16: one launch of the step kernel, `generation.DIRECT_STEP`, its
        y_t the kernel's own). docs/design.md, "Generation: prefill and step"."""
        return generation.prefill_fftconv(self, x, max_len, cuda_graph)

    def step(self, x_t: Tensor, state: generation.ConvState) -> tuple[Tensor, generation.ConvState]:
        """One position: x_t (B, C) -> y_t (B, C), exactly as the whole-sequence call computes
        it (in another rounding order); amortised O(log² max_len) work per channel. Updates
        `state` in place and returns it; records no gradient. RuntimeError past max_len or
        after a filter change, ValueError on a shape, dtype or device unlike the prefill's."""
        return generation.step_fftconv(self, x_t, state)

    def extra_repr(self) -> str:
        options = "" if self.groups == self.channels else f", groups={self.groups}"
        options += f", bidirectional={self.bidirectional!r}" if self.bidirectional else ""
        return f"channels={self.channels}, seq_len={self.seq_len}{options}, precision={self.precision!r}"


class _SpectrumCache:
    """A layer's filter spectra inside an inference_cache() block, one entry per input length,
    precision, backend, filter shape, dtype, device and CUDA stream, each beside the copy of the
    filter (`source`) it was computed from. Every call brings its entry up to date with the
    filter as it is at that call, so no write, by any route, leaves a call with an old spectrum:

    - CUDA, radix spectra (N <= 32768): one launch compares the filter with the source and
      recomputes the channels that differ, in place, with no host sync. Entries are per stream,
      so a refresh never races a convolution reading the same spectrum on another stream.
    - CPU: a bitwise comparison on the host (a few µs against the FFTs it saves); a changed
      filter gets a new entry, never an in-place update, so threads sharing the layer are safe.
    - CUDA otherwise (four-step N > 32768, torch.fft): a comparison would need a host sync,
      which costs more than the spectrum: these calls compute it as outside the block."""

    def __init__(self) -> None:
        self.entries: dict[tuple, tuple[Tensor, Tensor]] = {}  # key -> (source, spectrum)

    def spectrum(self, backend: Backend, filt: Tensor, precision: str) -> Tensor:
        length = filt.shape[-1]
        filt = filt.detach()
        in_place = backend.refreshes_in_place(filt, length)
        if filt.is_cuda and not in_place:
            return backend.filter_spectrum(filt, length, precision)
        # The current stream's id without building a torch.cuda.Stream (torch.cuda.current_stream's
        # own call, ~20% of a cached call's host time in session 36's profile).
        stream = torch._C._cuda_getCurrentStream(filt.device.index)[0] if filt.is_cuda else None
        key = (length, precision, backend, tuple(filt.shape), filt.dtype, filt.device, stream)
        entry = self.entries.get(key)
        if entry is not None and in_place:
            source, spectrum = entry
            backend.refresh_spectrum(filt, source, spectrum, length, precision)
            return spectrum
        if entry is not None and torch.equal(_bits(entry[0]), _bits(filt.to(entry[0].dtype))):
            return entry[1]
        # Ordinary tensors even under inference_mode: the CUDA refresh writes them in place later,
        # perhaps outside it.
        with torch.inference_mode(False):
            source = filt.to(compute_dtype(filt), memory_format=torch.contiguous_format, copy=True)
            spectrum = backend.filter_spectrum(source, length, precision)
        self.entries[key] = (source, spectrum)
        return spectrum


@contextlib.contextmanager
def inference_cache(model: nn.Module) -> Iterator[None]:
    """Inside the block, the `FFTConv` layers of `model` keep their filter spectra between calls
    and recompute one only where the filter has changed since, instead of on every call:

        with torch.no_grad(), monarch_fftconv.inference_cache(model):
            for batch in loader:
                out = model(batch)

    Every call sees the filter as it is at that call, whatever wrote it (an optimizer step,
    fused or not, `p.data.copy_()`, `load_state_dict`, a new Parameter, a numpy view): each
    call compares the filter with the copy its cached spectrum was computed from, bit for bit.
    On CUDA (N <= 32768) that comparison and the recomputation of the changed channels are one
    launch with no host sync; on the CPU, a host comparison. What it saves: the spectrum's FFTs
    (on CUDA one kernel, about 0.03 ms at C=256, L=8192) for the price of reading the filter
    twice. Calls that record a gradient for the filter, compiled graphs, and CUDA calls with
    no in-place refresh (N > 32768, torch.fft) compute the spectrum as outside the block.
    Costs one copy of each filter and its spectra per input length, precision and stream.
    Blocks nest: an inner block on a layer already cached keeps the outer block's cache. The
    cache belongs to the layers, not to the thread: other threads calling the same layers
    inside the block use it too.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"inference_cache(model): model must be a torch.nn.Module, got {type(model).__name__}")
    entered: list[FFTConv] = []
    try:
        for layer in model.modules():
            if isinstance(layer, FFTConv) and layer._spectra is None:
                layer._spectra = _SpectrumCache()
                entered.append(layer)
        yield
    finally:
        for layer in entered:
            layer._spectra = None
