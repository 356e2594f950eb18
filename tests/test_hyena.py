"""monarch_fftconv.nn.HyenaOperator against a plain-PyTorch twin with the same parameter names
(the safari operator's; the twin holds no package code), forward and gradients; compiled
training steps; autocast."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import monarch_fftconv as mf
from monarch_fftconv import backends, hyena
from monarch_fftconv.nn import HyenaOperator

from helpers import randn, rel_l2

TWIN_TOLERANCE = 5e-6  # two fp32 computations of the same function (relative L2; measured <= 7e-7)


# --------------------------------------------------------------------------- the twin

class TwinSin(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.freq = nn.Parameter(torch.empty(1, dim))

    def forward(self, x):
        return torch.sin(self.freq * x)


class TwinPositions(nn.Module):
    def __init__(self, l_max, emb_dim):
        super().__init__()
        self.z = nn.Parameter(torch.empty(1, l_max, emb_dim))
        self.register_buffer("t", torch.empty(1, l_max, 1))


class TwinModulation(nn.Module):
    def __init__(self, filters):
        super().__init__()
        self.register_buffer("deltas", torch.empty(1, 1, filters))


class TwinFilter(nn.Module):
    def __init__(self, channels, filters, l_max, width, bidirectional, emb_dim=3, inner=2):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(channels))
        self.pos_emb = TwinPositions(l_max, emb_dim)
        sin = TwinSin(width)
        for name in ("implicit_filter", "implicit_filter_rev") if bidirectional else ("implicit_filter",):
            layers = [nn.Linear(emb_dim, width), sin]
            for _ in range(inner):
                layers += [nn.Linear(width, width), sin]
            setattr(self, name, nn.Sequential(*layers, nn.Linear(width, filters, bias=False)))
        self.modulation = TwinModulation(filters)

    def filters(self, mlp, length):
        """(L, filters): the MLP over the positions, times the decay window."""
        z, t = self.pos_emb.z[0, :length], self.pos_emb.t[0, :length]
        return mlp(z) * torch.exp(-t * self.modulation.deltas[0].abs())


def twin_long_conv(v, h, D):
    """safari's reference: rfft of v and h at 2L, h scaled by 1/(2L), irfft without scaling,
    the first L outputs, plus D·v. h may be 2L long (M2's bidirectional filter)."""
    length = v.shape[-1]
    spectrum = torch.fft.rfft(v, n=2 * length) * torch.fft.rfft(h, n=2 * length) / (2 * length)
    return torch.fft.irfft(spectrum, n=2 * length, norm="forward")[..., :length] + v * D.unsqueeze(-1)


class TwinHyena(nn.Module):
    """The operator written out: safari's gating order and filter layout, filters repeated over
    their groups, M2's bidirectional filter (forward filter padded right by L, the reverse
    filter flipped and padded left by L)."""

    def __init__(self, d_model, l_max, order, groups, bidirectional, width=64):
        super().__init__()
        self.d_model, self.order, self.groups, self.bidirectional = d_model, order, groups, bidirectional
        self.out_proj = nn.Linear(d_model, d_model)
        self.in_proj = nn.Linear(d_model, (order + 1) * d_model)
        total = (order + 1) * d_model
        self.short_filter = nn.Conv1d(total, total, 3, groups=total, padding=2)
        self.filter_fn = TwinFilter(d_model * (order - 1), groups * (order - 1), l_max, width, bidirectional)

    def per_step(self, h):
        """(L, G·(order-1)) -> (order-1, d_model, L): feature g·(order-1) + o is step o's filter g."""
        h = h.reshape(h.shape[0], self.groups, self.order - 1).permute(2, 1, 0)
        return h.repeat_interleave(self.d_model // self.groups, dim=1)

    def forward(self, u):
        length = u.shape[1]
        h = self.per_step(self.filter_fn.filters(self.filter_fn.implicit_filter, length))
        if self.bidirectional:
            h_rev = self.per_step(self.filter_fn.filters(self.filter_fn.implicit_filter_rev, length))
            h = F.pad(h, (0, length)) + F.pad(h_rev.flip(-1), (length, 0))
        bias = self.filter_fn.bias.reshape(self.d_model, self.order - 1).T
        x = list(self.short_filter(self.in_proj(u).transpose(1, 2))[..., :length].split(self.d_model, dim=1))
        v = x.pop()
        for o, x_i in enumerate(reversed(x[1:])):
            v = twin_long_conv(v * x_i, h[o], bias[o])
        return self.out_proj((v * x[0]).transpose(1, 2))


def operator_and_twin(gen, d_model=9, l_max=47, order=2, groups=None, bidirectional=False):
    """The operator with random weights (its buffers as built), and the twin loaded from its state_dict."""
    op = HyenaOperator(d_model, l_max, order=order, filter_groups=groups, bidirectional=bidirectional)
    with torch.no_grad():
        for p in op.parameters():
            p.copy_(0.5 * randn(gen, *p.shape))
    twin = TwinHyena(d_model, l_max, order, groups or d_model, bidirectional)
    twin.load_state_dict(op.state_dict())  # strict: the same names and shapes
    return op, twin


# --------------------------------------------------------------------------- tests

@pytest.mark.parametrize("engine", ["auto", "portable"])
@pytest.mark.parametrize("order, groups, bidirectional", [(2, None, False), (3, None, False), (2, 3, False),
                                                          (3, 3, True), (2, None, True)])
@pytest.mark.parametrize("length", [47, 33])
def test_operator_matches_its_twin(engine, order, groups, bidirectional, length, monkeypatch, gen):
    """Same state_dict, same output and the same gradient for every parameter; odd sizes,
    inputs as long as l_max and shorter."""
    monkeypatch.setenv(backends.BACKEND_ENV, engine)
    op, twin = operator_and_twin(gen, order=order, groups=groups, bidirectional=bidirectional)
    x = randn(gen, 3, length, 9)
    y, want = op(x), twin(x)
    assert y.shape == x.shape and rel_l2(y, want) <= TWIN_TOLERANCE
    g = randn(gen, *y.shape)
    y.backward(g)
    want.backward(g)
    twin_params = dict(twin.named_parameters())
    for name, p in op.named_parameters():
        assert rel_l2(p.grad, twin_params[name].grad) <= TWIN_TOLERANCE, name


def test_state_dict_names_are_safaris(gen):
    """The keys a safari HyenaOperator (one head, order 2, filter_order 64, emb_dim 3) saves."""
    op = HyenaOperator(8, 32)
    mlp = [f"filter_fn.implicit_filter.{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias")]
    sines = [f"filter_fn.implicit_filter.{i}.freq" for i in (1, 3, 5)]
    assert set(op.state_dict()) == {
        "in_proj.weight", "in_proj.bias", "out_proj.weight", "out_proj.bias", "short_filter.weight",
        "short_filter.bias", "filter_fn.bias", "filter_fn.pos_emb.z", "filter_fn.pos_emb.t",
        "filter_fn.modulation.deltas", "filter_fn.implicit_filter.6.weight", *mlp, *sines}
    assert op.filter_fn.implicit_filter[1] is op.filter_fn.implicit_filter[5]  # one Sin, as safari's


@pytest.mark.parametrize("engine, order, groups, bidirectional", [("portable", 3, 3, False), ("auto", 2, None, True)])
def test_compiled_training_step_matches_eager(engine, order, groups, bidirectional, monkeypatch, gen):
    """torch.compile(fullgraph=True) of the loss, through the operator: the loss and every
    parameter's gradient match eager, also after an update of the weights."""
    monkeypatch.setenv(backends.BACKEND_ENV, engine)
    op, _ = operator_and_twin(gen, order=order, groups=groups, bidirectional=bidirectional)
    x, target = randn(gen, 3, 41, 9), randn(gen, 3, 41, 9)

    def loss_of(x, target):
        return (op(x) - target).square().mean()

    compiled = torch.compile(loss_of, fullgraph=True, backend="aot_eager")
    params = list(op.parameters())
    for _ in range(2):
        eager_loss = loss_of(x, target)
        eager_grads = torch.autograd.grad(eager_loss, params)
        compiled_loss = compiled(x, target)
        compiled_grads = torch.autograd.grad(compiled_loss, params)
        torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=0)
        for got, want in zip(compiled_grads, eager_grads):
            assert rel_l2(got, want) <= 1e-5
        with torch.no_grad():  # a (normalised) gradient step: the compiled graph must follow it
            for p, grad in zip(params, eager_grads):
                p.sub_(0.1 * grad / grad.norm().clamp_min(1e-12))


def test_autocast_runs_projections_and_convolutions_in_bf16_with_fp32_filters(monkeypatch, gen):
    """Under CPU autocast (bf16) the projections and the gated convolutions run in bf16 (the
    precision policy takes bf16 for bf16 activations), the implicit filters and their gradients
    stay fp32, and the output is within bf16's reach of the fp32 operator's."""
    monkeypatch.setenv(backends.BACKEND_ENV, "portable")  # so the bf16 path is the emulated one
    op, _ = operator_and_twin(gen, order=3, groups=3)
    calls = []

    def spy(u, k, **options):
        call = {"u": u.dtype, "k": k.dtype, "pregate": options["pregate"].dtype,
                "precision": mf.explain(u, k, **options)["precision"]}
        calls.append(call)
        if k.requires_grad:
            k.register_hook(lambda grad: call.update(dk=grad.dtype))
        return mf.fftconv(u, k, **options)

    monkeypatch.setattr(hyena, "fftconv", spy)
    x = randn(gen, 2, 47, 9)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = op(x)
    assert y.dtype == torch.bfloat16 and len(calls) == 2
    y.float().square().mean().backward()
    for call in calls:
        assert (call["u"], call["pregate"], call["precision"]) == (torch.bfloat16, torch.bfloat16, "bf16")
        assert call["k"] == call["dk"] == torch.float32
    assert all(p.grad.dtype == torch.float32 for p in op.filter_fn.parameters())
    with torch.no_grad():
        exact = op(x)
    assert calls[-1]["precision"] == "fp32"  # without autocast: fp32 activations, fp32 path
    assert 1e-4 < rel_l2(y, exact) <= 5e-2  # bf16 activations: a few bf16 roundings on the way


def test_operator_errors():
    with pytest.raises(ValueError, match="order must be at least 2"):
        HyenaOperator(8, 32, order=1)
    with pytest.raises(ValueError, match="filter_groups must be a positive divisor of d_model=8"):
        HyenaOperator(8, 32, filter_groups=3)
    with pytest.raises(ValueError, match="input length 33 exceeds the operator's l_max 32"):
        HyenaOperator(8, 32)(torch.randn(1, 33, 8))
    with pytest.raises(ValueError, match="emb_dim must be odd"):
        HyenaOperator(8, 32, emb_dim=4)
