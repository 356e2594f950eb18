"""`HyenaOperator`: the Hyena operator (Poli et al. 2023, arXiv:2302.10866) on `fftconv`.

Its structure and parameter names follow safari's operator (HazyResearch/safari,
src/models/sequence/hyena.py: one head, one block, no outer mixing), so a state_dict trained
there loads as is: `in_proj`, `short_filter`, `filter_fn` (`bias`, `pos_emb.z`/`.t`,
`implicit_filter`, `modulation.deltas`) and `out_proj`. Two options go beyond it:
`filter_groups` (channels sharing implicit filters, as savanna's grouped Hyena) and
`bidirectional` (a second, anti-causal filter MLP `implicit_filter_rev`, as Monarch Mixer's
HyenaFilter in HazyResearch/m2, bert/src/mm/hyena_utils.py).

Each order step is one `fftconv` call with the step's gate as `pregate`, the filter bias as
`D` (it scales the gated input, as safari's `fftconv(v, k, bias)` after `v = v * x_i`), and
on the last step the output gate as `postgate`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from . import generation
from .functional import bidirectional_convention, fftconv


class Sin(nn.Module):
    """sin(freq ⊙ x), one trainable frequency per feature."""

    def __init__(self, dim: int, w: float = 10.0):
        super().__init__()
        self.freq = nn.Parameter(w * torch.ones(1, dim))

    def forward(self, x: Tensor) -> Tensor:
        return torch.sin(self.freq * x)


class PositionalEmbedding(nn.Module):
    """The filter MLP's input at each position t < seq_len: t/(seq_len - 1), then the real and
    imaginary parts of exp(-i·f·2πt/seq_len) for `bands` = (emb_dim - 1)/2 frequencies f
    spread over [1e-4, bands - 1]. `z` trains (safari gives it a small learning rate); `t`, the
    positions in [0, 1] that the decay window reads, is a buffer."""

    def __init__(self, emb_dim: int, seq_len: int):
        super().__init__()
        bands = (emb_dim - 1) // 2
        t = torch.linspace(0, 1, seq_len)[None, :, None]  # (1, L, 1)
        angles = 2 * math.pi * torch.arange(seq_len).unsqueeze(-1) / seq_len * torch.linspace(1e-4, bands - 1, bands)
        self.z = nn.Parameter(torch.cat([t[0], angles.cos(), -angles.sin()], dim=-1).unsqueeze(0))  # (1, L, emb_dim)
        self.register_buffer("t", t)

    def forward(self, length: int) -> tuple[Tensor, Tensor]:
        return self.z[:, :length], self.t[:, :length]


class ExponentialModulation(nn.Module):
    """Each filter times a decay window exp(-|delta_c|·t) (+ shift), the rates spread from
    slow (the window falls to `target` at t = slow_decay_pct) to fast (at t = fast_decay_pct)."""

    def __init__(self, d_model: int, fast_decay_pct: float = 0.3, slow_decay_pct: float = 1.5,
                 target: float = 1e-2, modulate: bool = True, shift: float = 0.0):
        super().__init__()
        self.modulate, self.shift = modulate, shift
        deltas = torch.linspace(math.log(target) / slow_decay_pct, math.log(target) / fast_decay_pct, d_model)
        self.register_buffer("deltas", deltas[None, None])  # (1, 1, d_model)

    def forward(self, t: Tensor, x: Tensor) -> Tensor:
        if not self.modulate:
            return x
        return x * (torch.exp(-t * self.deltas.abs()) + self.shift)


class HyenaFilter(nn.Module):
    """Implicit long filters: an MLP with sine activations over positional features, times a
    decay window. `filter(L)` is (1, L, filters); `bias` (d_model,) is the skip term D of the
    channels the filters serve.

    Args:
        d_model: the channels (the size of `bias`).
        emb_dim: positional features (odd, >= 3).
        order: the MLP's width.
        seq_len: the longest filter.
        w: the sine activations' initial frequency.
        bias: whether the skip term applies (safari's `bias=False` multiplies it by zero).
        num_inner_mlps: hidden layers of width `order`.
        filters: the distinct filters, the MLP's output width (default d_model).
        bidirectional: a second MLP, `implicit_filter_rev`, for the anti-causal filters; it shares
            the positional features, the decay window and the sine frequencies, as in Monarch Mixer.
        **modulation_args: ExponentialModulation's options.
    """

    def __init__(self, d_model: int, emb_dim: int = 3, order: int = 16, seq_len: int = 1024, w: float = 1.0,
                 bias: bool = True, num_inner_mlps: int = 2, filters: int | None = None,
                 bidirectional: bool = False, **modulation_args):
        super().__init__()
        if emb_dim % 2 == 0 or emb_dim < 3:
            raise ValueError(f"emb_dim must be odd and at least 3 (time, cosines, sines), got {emb_dim}")
        filters = d_model if filters is None else filters
        self.d_model, self.use_bias, self.bidirectional = d_model, bias, bidirectional
        self.bias = nn.Parameter(torch.randn(d_model))
        act = Sin(order, w)  # one module at every activation: safari's MLP shares its frequencies
        self.pos_emb = PositionalEmbedding(emb_dim, seq_len)
        self.implicit_filter = self._mlp(emb_dim, order, filters, num_inner_mlps, act)
        if bidirectional:
            self.implicit_filter_rev = self._mlp(emb_dim, order, filters, num_inner_mlps, act)
        self.modulation = ExponentialModulation(filters, **modulation_args)

    @staticmethod
    def _mlp(emb_dim: int, order: int, filters: int, num_inner_mlps: int, act: nn.Module) -> nn.Sequential:
        mlp = nn.Sequential(nn.Linear(emb_dim, order), act)
        for _ in range(num_inner_mlps):
            mlp.append(nn.Linear(order, order))
            mlp.append(act)
        mlp.append(nn.Linear(order, filters, bias=False))
        return mlp

    def filter(self, length: int) -> Tensor:
        z, t = self.pos_emb(length)
        return self.modulation(t, self.implicit_filter(z))

    def filter_rev(self, length: int) -> Tensor:
        z, t = self.pos_emb(length)
        return self.modulation(t, self.implicit_filter_rev(z))


class HyenaOperator(nn.Module):
    """The Hyena operator: x (B, L, d_model) -> y (B, L, d_model), L <= l_max.

        (x_0, ..., x_{order-1}, v) = short_filter(in_proj(x))   (causal, depthwise)
        v <- fftconv(v, h_o, D=bias_o, pregate=x_{order-1-o})   for o = 0 .. order-2,
             the last step with postgate=x_0
        y = out_proj(v)

    Args:
        d_model: the width.
        l_max: the longest sequence (the implicit filters' length).
        order: the recurrence depth, >= 2 (order - 1 long convolutions).
        filter_order: the width of the filter MLP.
        short_filter_order: the short depthwise causal convolution's length.
        filter_groups: G, the implicit filters per order step, dividing d_model: channel c takes
            filter c // (d_model // G). None (default): one per channel, as safari.
        bidirectional: False, or each step adds an anti-causal filter
            (`filter_fn.implicit_filter_rev`) in the convention named as in `fftconv`: "m2" (or
            True, its meaning here since the option exists), tap s weighing v at t + s + 1, as
            Monarch Mixer's sequence mixer computes it (the reverse filter flipped and padded on
            the left by L, N = 2L), so an M2 filter gives M2's convolution; or "fftconv_ref", tap
            s weighing v at t + s.
        precision: the long convolutions' precision (None: the policy, `monarch_fftconv.precision`).
        **filter_args: HyenaFilter's options (emb_dim, w, bias, num_inner_mlps, and the
            modulation's fast_decay_pct, slow_decay_pct, target, modulate, shift).

    Under autocast the projections and the short filter run in the autocast dtype, and so do
    the long convolutions (their inputs are then bf16/fp16: the precision policy takes that
    precision); the implicit filters are computed in fp32 with autocast off, so the filters
    and their gradients stay fp32. Safari's per-parameter optimizer hints (`_optim`), dropout
    and multi-head options are not carried over.
    """

    def __init__(self, d_model: int, l_max: int, order: int = 2, filter_order: int = 64,
                 short_filter_order: int = 3, filter_groups: int | None = None, bidirectional: bool | str = False,
                 precision: str | None = None, **filter_args):
        super().__init__()
        if order < 2:
            raise ValueError(f"order must be at least 2, got {order}")
        groups = d_model if filter_groups is None else filter_groups
        if groups < 1 or d_model % groups:
            raise ValueError(f"filter_groups must be a positive divisor of d_model={d_model}, got {filter_groups}")
        self.d_model, self.l_max, self.order, self.filter_groups = d_model, l_max, order, groups
        # True keeps the meaning it has always had here, M2's convention (fftconv's True is "fftconv_ref").
        self.bidirectional = "m2" if bidirectional is True else (bidirectional_convention(bidirectional) or False)
        self.precision = precision
        self.out_proj = nn.Linear(d_model, d_model)
        self.in_proj = nn.Linear(d_model, (order + 1) * d_model)
        width = (order + 1) * d_model
        self.short_filter = nn.Conv1d(width, width, kernel_size=short_filter_order, groups=width,
                                      padding=short_filter_order - 1)
        self.filter_fn = HyenaFilter(d_model * (order - 1), order=filter_order, seq_len=l_max,
                                     filters=groups * (order - 1), bidirectional=bool(self.bidirectional), **filter_args)

    def long_filters(self, length: int) -> tuple[Tensor, Tensor | None]:
        """(filters (order-1, G, L), or (order-1, G, 2, L) bidirectional; D (order-1, d_model) or None).
        Safari's MLP output feature g·(order-1) + o is step o's filter g; its bias likewise."""
        steps = self.order - 1
        with torch.autocast(self.filter_fn.bias.device.type, enabled=False):
            k = self.filter_fn.filter(length)[0].T.unflatten(0, (-1, steps)).transpose(0, 1)
            if self.bidirectional:
                k_rev = self.filter_fn.filter_rev(length)[0].T.unflatten(0, (-1, steps)).transpose(0, 1)
                k = torch.stack([k, k_rev], dim=2)  # placed by fftconv as self.bidirectional names
        bias = self.filter_fn.bias.unflatten(0, (-1, steps)).T if self.filter_fn.use_bias else None
        return k, bias

    def forward(self, x: Tensor) -> Tensor:
        self._check_input(x)
        length = x.shape[-2]
        projected = self.in_proj(x).transpose(1, 2)  # (B, (order+1)·d_model, L)
        projected = self.short_filter(projected)[..., :length]  # padded both sides: the first L are causal
        *gates, v = projected.split(self.d_model, dim=1)
        k, bias = self.long_filters(length)
        for step, gate in enumerate(reversed(gates[1:])):
            last = step == self.order - 2
            v = self.long_conv(v, k[step], None if bias is None else bias[step], gate, gates[0] if last else None)
        return self.out_proj(v.transpose(1, 2))

    def _check_input(self, x: object, min_len: int = 1) -> None:
        """x must be (B, L, d_model), min_len <= L <= l_max (a prompt may be empty), floating
        point, in the parameters' dtype unless autocast casts it: name the expected and the given
        shape or dtype."""
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor of shape (B, L, d_model), got {type(x).__name__}")
        shape, d_model = tuple(x.shape), self.d_model
        if x.dim() != 3 or shape[-1] != d_model:
            hint = ""
            if x.dim() == 2 and shape[-1] == d_model:
                hint = "; an unbatched (L, d_model) input takes a batch dim: x.unsqueeze(0)"
            elif x.dim() == 3 and shape[1] == d_model:
                hint = "; it looks like (B, d_model, L): the operator takes (B, L, d_model), e.g. x.transpose(1, 2)"
            raise ValueError(f"x must have shape (B, L, d_model) = (B, L, {d_model}), got {shape}{hint}")
        if not min_len <= shape[1] <= self.l_max:
            too_long = f"input length {shape[1]} exceeds the operator's l_max {self.l_max}: " if shape[1] else ""
            raise ValueError(f"{too_long}x must have shape (B, L, {d_model}) with {min_len} <= L <= {self.l_max}, "
                             f"got {shape}")
        weight = self.in_proj.weight
        if not x.is_floating_point() or (x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type)):
            raise TypeError(f"x must be floating point in the parameters' dtype {weight.dtype} (or run under "
                            f"torch.autocast), got {x.dtype}")

    def long_conv(self, v: Tensor, k: Tensor, D: Tensor | None, pregate: Tensor, postgate: Tensor | None) -> Tensor:
        """One order step: postgate ⊙ (conv(pregate ⊙ v, k) + D ⊙ (pregate ⊙ v)), one `fftconv`
        call. A subclass may replace it (a reference implementation, to compare against)."""
        return fftconv(v, k, D=D, pregate=pregate, postgate=postgate, bidirectional=self.bidirectional,
                       precision=self.precision)

    def prefill(self, x: Tensor, max_len: int, *, cuda_graph: bool = False) -> tuple[Tensor, generation.HyenaState]:
        """Start generating: x the prompt (B, P, d_model), 0 <= P <= max_len <= l_max. Returns
        (y, state): y the operator's output for the prompt, computed as forward computes it;
        `state` for `step` at positions P .. max_len - 1 (the short filter's window, one
        long-convolution stream per order step). step uses the operator as it is now, like a
        KV cache: it raises RuntimeError if a parameter or buffer was replaced, converted,
        written in place or stepped by a torch.optim optimizer since, or a module's plain
        setting changed (in-place `.data` writes go unseen: prefill again). Bidirectional
        operators raise ValueError. cuda_graph=True (CUDA only) captures the whole step
        (projections, short filter, gates, every long convolution, D) as CUDA graphs here, one
        per block level: a step is then one copy and one graph launch, and its y_t a view of the
        state's output history. docs/design.md, "Generation: prefill and step"."""
        return generation.prefill_hyena(self, x, max_len, cuda_graph)

    def step(self, x_t: Tensor, state: generation.HyenaState) -> tuple[Tensor, generation.HyenaState]:
        """One position: x_t (B, d_model) -> y_t (B, d_model), as forward computes it on the
        whole sequence; amortised O(log² max_len) work per channel for the long convolutions.
        Updates `state` in place and returns it; records no gradient."""
        return generation.step_hyena(self, x_t, state)

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, l_max={self.l_max}, order={self.order}, "
                f"filter_groups={self.filter_groups}, bidirectional={self.bidirectional}, precision={self.precision!r}")
