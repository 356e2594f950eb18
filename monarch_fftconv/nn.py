"""`FFTConv`: a drop-in nn.Module for the long convolution of SSM layers."""

from __future__ import annotations

import weakref

import torch
from torch import Tensor, nn

from . import functional, policy
from .backends import Backend


_MODULE_NAMES = functional.ArgNames(u="the input", k="the filter", D="D")


class FFTConv(nn.Module):
    """y = causal_conv(x, filter) over the last dim, per channel.

    Args:
        channels: C, the number of independent channels (each has its own filter).
        seq_len: the longest input length L; also the filter length.
        precision: "fp32", "tf32", "bf16", "fp16", or None to follow the precision policy
            (a `monarch_fftconv.precision()` block, the environment, the input's dtype).
        device, dtype: of the `filter` parameter.

    Same parameter (`filter`, shape (channels, seq_len), randn init) as the plain torch.fft
    model it replaces, so its state_dict loads as is. Inputs may be shorter than seq_len.

    Calls take the same path as `fftconv`. Without autograd (inference), the filter
    spectrum is cached and recomputed whenever the parameter changes: its `_version`
    (in-place updates such as optimizer steps), identity, storage, device or dtype, the
    input length, the precision or the backend.
    """

    def __init__(self, channels: int, seq_len: int, *, precision: str | None = None, device=None, dtype=None):
        super().__init__()
        if precision is not None:
            policy.check_precision(precision)
        self.channels, self.seq_len = channels, seq_len
        self.precision = precision
        self.filter = nn.Parameter(torch.randn(channels, seq_len, device=device, dtype=dtype))
        self._spectrum_key: tuple | None = None
        self._spectrum_source: weakref.ref | None = None
        self._spectrum: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, C, L), (C, L) or (..., C, L) with L <= seq_len; returns y of x's shape and
        dtype, y[..., c, t] = Σ_{s<=t} filter[c, s]·x[..., c, t-s]."""
        length = x.shape[-1]
        if length > self.seq_len:
            raise ValueError(f"input length {length} exceeds the module's seq_len {self.seq_len}")
        filt = self.filter if length == self.seq_len else self.filter[:, :length]
        return functional.conv(x, filt, None, None, self.precision, self._cached_spectrum, _MODULE_NAMES)

    def _cached_spectrum(self, backend: Backend, filt: Tensor, precision: str) -> Tensor:
        p = self.filter
        # The weak reference tells a replaced parameter apart even if its id() is reused;
        # _version counts in-place updates (optimizer steps); data_ptr catches `.data =`.
        key = (p._version, p.data_ptr(), p.device, p.dtype, filt.shape[-1], precision, backend)
        if self._spectrum_source is None or self._spectrum_source() is not p or key != self._spectrum_key:
            with torch.no_grad():
                self._spectrum = backend.filter_spectrum(filt.detach(), filt.shape[-1], precision)
            self._spectrum_key, self._spectrum_source = key, weakref.ref(p)
        assert self._spectrum is not None
        return self._spectrum

    def extra_repr(self) -> str:
        return f"channels={self.channels}, seq_len={self.seq_len}, precision={self.precision!r}"
