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
        bidirectional: filters of shape (G, 2, seq_len), [:, 0] causal and [:, 1] anti-causal,
            as `fftconv(..., bidirectional=True)` defines them.
        precision: "fp32", "tf32", "bf16", "fp16", or None to follow the precision policy
            (a `monarch_fftconv.precision()` block, the environment, the input's dtype).
        device, dtype: of the `filter` parameter.

    By default the same parameter (`filter`, shape (channels, seq_len), randn init) as the plain
    torch.fft model it replaces, so its state_dict loads as is. Inputs may be shorter than seq_len.

    Every call computes the filter spectrum from the parameter as it is at that call, so no
    write to the filter, by any route, can leave a call with an old one. For serving, where
    the filter is fixed, `inference_cache(model)` computes each spectrum once for a block.
    """

    def __init__(
        self, channels: int, seq_len: int, *, groups: int | None = None, bidirectional: bool = False,
        precision: str | None = None, device=None, dtype=None,
    ):
        super().__init__()
        if precision is not None:
            policy.check_precision(precision)
        groups = channels if groups is None else groups
        if not isinstance(groups, int) or groups < 1 or channels % groups:
            raise ValueError(f"groups must be a positive divisor of channels={channels}, got {groups!r}")
        self.channels, self.seq_len, self.groups, self.bidirectional = channels, seq_len, groups, bidirectional
        self.precision = precision
        shape = (groups, 2, seq_len) if bidirectional else (groups, seq_len)
        self.filter = nn.Parameter(torch.randn(shape, device=device, dtype=dtype))
        self._frozen: _FrozenFilter | None = None  # set inside an inference_cache() block only

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, C, L), (C, L) or (..., C, L) with L <= seq_len; returns y of x's shape and
        dtype, y[..., c, t] = Σ_{s<=t} filter[c // (C // G), s]·x[..., c, t-s] (bidirectional:
        plus the anti-causal half, as `fftconv` defines it)."""
        length = x.shape[-1]
        if length > self.seq_len:
            raise ValueError(f"input length {length} exceeds the module's seq_len {self.seq_len}")
        filt = self.filter if length == self.seq_len else self.filter[..., :length]
        # A compiled graph computes the spectrum itself and never reads the cache state: a guard
        # on it would recompile the graph at every inference_cache() block.
        cached = None if torch.compiler.is_compiling() or self._frozen is None else self._frozen.spectrum
        return functional.conv(x, filt, None, None, self.precision, cached, _MODULE_NAMES,
                               bidirectional=self.bidirectional)

    def prefill(self, x: Tensor, max_len: int) -> tuple[Tensor, generation.ConvState]:
        """Start generating: x the prompt (B, C, P), 0 <= P <= max_len <= seq_len. Returns
        (y, state): y = self(x), the ordinary call; `state` for `step` at positions
        P .. max_len - 1. The state holds values derived from the filter as it is now (block
        spectra, the prompt's contribution): step uses that filter, like a KV cache, and
        raises RuntimeError if `filter` was replaced or written in place since (its version
        counter; a `.data` write bypasses that check). Bidirectional layers raise ValueError.
        docs/design.md, "Generation: prefill and step"."""
        return generation.prefill_fftconv(self, x, max_len)

    def step(self, x_t: Tensor, state: generation.ConvState) -> tuple[Tensor, generation.ConvState]:
        """One position: x_t (B, C) -> y_t (B, C), exactly as the whole-sequence call computes
        it (in another rounding order); amortised O(log² max_len) work per channel. Updates
        `state` in place and returns it; records no gradient. RuntimeError past max_len or
        after a filter change, ValueError on a shape, dtype or device unlike the prefill's."""
        return generation.step_fftconv(self, x_t, state)

    def extra_repr(self) -> str:
        options = "" if self.groups == self.channels else f", groups={self.groups}"
        options += ", bidirectional=True" if self.bidirectional else ""
        return f"channels={self.channels}, seq_len={self.seq_len}{options}, precision={self.precision!r}"


class _FrozenFilter:
    """A layer's filter as it was when its inference_cache() block began, and the spectra
    computed from that copy (one per input length, precision and backend).

    The spectra derive from the private copy, never from the live parameter, so they cannot
    disagree with each other. Whether the live parameter still equals the copy is checked
    twice: on every call by the cheap host-side facts (identity, storage, version, dtype),
    and at the block's end by the contents, bit for bit: `p.data.add_()`, `p.data.copy_()`,
    `vector_to_parameters` and `.data`-level optimisers change no version counter."""

    def __init__(self, layer: FFTConv) -> None:
        self.layer = layer
        self.param = layer.filter
        self.facts = _host_facts(self.param)
        self.snapshot = self.param.detach().clone()
        self.spectra: dict[tuple, Tensor] = {}

    def _same_parameter(self) -> bool:
        """The host-side facts: the layer's filter is the same Parameter, storage and version."""
        return self.layer.filter is self.param and _host_facts(self.param) == self.facts

    def spectrum(self, backend: Backend, filt: Tensor, precision: str) -> Tensor:
        if not self._same_parameter():
            raise RuntimeError(
                "FFTConv.filter changed inside an inference_cache() block, whose calls use the filter as it "
                "was when the block began: leave the block before changing the filter, and enter it again")
        length = filt.shape[-1]
        key = (length, precision, backend)
        if (spectrum := self.spectra.get(key)) is None:
            with torch.no_grad():
                spectrum = self.spectra[key] = backend.filter_spectrum(self.snapshot[..., :length], length, precision)
        return spectrum

    def check_unchanged(self) -> None:
        if not (self._same_parameter() and torch.equal(_bits(self.param.detach()), _bits(self.snapshot))):
            raise RuntimeError(
                "FFTConv.filter was written inside an inference_cache() block (e.g. through `.data`), whose "
                "calls use the filter as it was when the block began: calls made after the write did not see "
                "it. Change the filter outside the block.")


def _host_facts(p: Tensor) -> tuple:
    version = None if p.is_inference() else p._version  # inference tensors keep no version counter
    return version, p.data_ptr(), p.device, p.dtype, tuple(p.shape), tuple(p.stride())


def _bits(t: Tensor) -> Tensor:
    """t's bits as integers: equal exactly when every bit is (NaN and -0.0 included)."""
    return t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


@contextlib.contextmanager
def inference_cache(model: nn.Module) -> Iterator[None]:
    """Inside the block, each `FFTConv` in `model` computes its filter spectrum once per input
    length, precision and backend, from its filter as it is on entry, instead of on every call.

        with torch.no_grad(), monarch_fftconv.inference_cache(model):
            for batch in loader:
                out = model(batch)

    The contract: the filters do not change inside the block. A change that the parameter's
    metadata shows (an optimizer step, `with torch.no_grad(): p.add_(...)`, `load_state_dict`,
    a new Parameter, `.to()`) raises RuntimeError at the next call; a write that bypasses it
    (`p.data.copy_(...)`, `vector_to_parameters`) raises RuntimeError when the block ends, by a
    bitwise comparison with the copy taken on entry. Never a silent result from an old filter.
    Calls that record a gradient for the filter and compiled graphs compute the spectrum as
    usual. Costs one copy of each filter, and one comparison (a device sync) on exit.
    Blocks nest: an inner block on a layer already cached keeps the outer block's copy. The
    cache belongs to the layers, not to the thread: other threads calling the same layers
    inside the block use it too.
    """
    entered: list[tuple[FFTConv, _FrozenFilter]] = []
    try:
        for layer in model.modules():
            if isinstance(layer, FFTConv) and layer._frozen is None:
                layer._frozen = _FrozenFilter(layer)
                entered.append((layer, layer._frozen))
        yield
    finally:  # on an error too, before it propagates
        for layer, _ in entered:
            layer._frozen = None
    for _, state in entered:  # reached on a normal exit only
        state.check_unchanged()
