"""The fused gated training step (issue #39, backends.FUSED_GATED_TRAINING): the ops
gated_fftconv and gated_fftconv_backward on the CPU (the portable engine, the executable spec
of the CUDA kernels' gated instances) against a float64 torch.fft reference built here, the
autograd path through `fftconv` with the switch on against autograd through that reference,
the switch on against off, and which calls take the path. The GPU side is
tests/test_cuda_gated_training.py."""

import itertools

import pytest
import torch

import monarch_fftconv as mf
from monarch_fftconv import backends, functional, ops

from helpers import BUDGETS, randn, rel_l2

GATES = ["pre", "post", "both"]


def causal_conv64(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Σ_{s<=t} k[c, s]·x[b, c, t-s] in float64 by torch.fft (zero-padded to 2L: nothing wraps)."""
    length = x.shape[-1]
    n = 2 * length
    return torch.fft.irfft(torch.fft.rfft(x.double(), n=n) * torch.fft.rfft(k.double(), n=n), n=n)[..., :length]


def gated_reference(u, k, D, pregate, postgate):
    """(y, z) in float64: x = pregate ⊙ u, z = conv(x, k) + D ⊙ x, y = postgate ⊙ z; k (G, Lk)
    repeated over its groups. Differentiable in every input (float64 autograd)."""
    x = u.double() if pregate is None else u.double() * pregate.double()
    z = causal_conv64(x, k.double().repeat_interleave(u.shape[-2] // k.shape[0], dim=0))
    if D is not None:
        z = z + D.double().unsqueeze(-1) * x
    return (z if postgate is None else z * postgate.double()), z


def inputs(gen, gates, with_D, batch=3, channels=5, groups=None):
    """Odd B, C and L, Lk < L: u, k, D, pregate, postgate (a gate absent where `gates` leaves it out)."""
    length = 2 * int(torch.randint(16, 151, (), generator=gen)) + 1
    filter_len = int(torch.randint(1, length, (), generator=gen))
    u = randn(gen, batch, channels, length)
    k = randn(gen, groups or channels, filter_len) / filter_len**0.5
    D = randn(gen, channels) if with_D else None
    pregate = randn(gen, batch, channels, length) if gates in ("pre", "both") else None
    postgate = randn(gen, batch, channels, length) if gates in ("post", "both") else None
    return u, k, D, pregate, postgate


@pytest.fixture
def fused_training_on_the_ops(monkeypatch):
    """The switch on, and the portable engine taken for a backend whose kernel takes the gates:
    training calls route to the gated ops' CPU implementations. Yields the ops' calls, by name."""
    monkeypatch.setenv(backends.BACKEND_ENV, "portable")
    monkeypatch.setattr(backends, "FUSED_GATED_TRAINING", True)
    monkeypatch.setattr(backends.Portable, "fuses_gates", True)
    calls = []
    for name in ("gated_fftconv_op", "gated_fftconv_backward_op", "gated_conv_forward_op"):
        real = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *args, _real=real, _name=name: (calls.append(_name), _real(*args))[1])
    return calls


# --------------------------------------------------------------------------- the ops (CPU)

@pytest.mark.parametrize("gates, with_D", list(itertools.product(GATES, [False, True])))
def test_gated_forward_op_matches_float64(gates, with_D, gen):
    """gated_fftconv: y and (with a postgate) z within the fp32 budget of the float64 reference;
    z empty without a postgate; the spectrum filter_spectrum's."""
    u, k, D, pregate, postgate = inputs(gen, gates, with_D)
    y, z, spectrum = ops.gated_fftconv_op(u, k, D, pregate, postgate, "fp32")
    want_y, want_z = gated_reference(u, k, D, pregate, postgate)
    assert y.dtype == u.dtype and y.shape == u.shape
    assert rel_l2(y, want_y) <= BUDGETS["fp32"]
    if postgate is None:
        assert z.numel() == 0
    else:
        assert z.shape == u.shape and rel_l2(z, want_z) <= BUDGETS["fp32"]
    assert torch.equal(spectrum, ops.filter_spectrum(k, u.shape[-1], "fp32"))


@pytest.mark.parametrize("gates, with_D", list(itertools.product(GATES, [False, True])))
def test_gated_backward_op_matches_float64_autograd(gates, with_D, gen):
    """gated_fftconv_backward: du, dk, dD and dpregate against float64 autograd through the
    reference (dk, dD those of x and dz = postgate ⊙ dy); dpostgate = dy ⊙ z, the op's where z is
    given to it (and then the same bits as the caller's multiply), empty where it is not."""
    u, k, D, pregate, postgate = inputs(gen, gates, with_D)
    spectrum = ops.filter_spectrum(k, u.shape[-1], "fp32")
    dy = randn(gen, *u.shape)
    z = None if postgate is None else ops.gated_fftconv_op(u, k, D, pregate, postgate, "fp32")[1]
    du, dk, dskip, dpregate, dpostgate = ops.gated_fftconv_backward_op(dy, u, spectrum, D, pregate, postgate,
                                                                       k.shape[-1], "fp32", z)
    without_z = ops.gated_fftconv_backward_op(dy, u, spectrum, D, pregate, postgate, k.shape[-1], "fp32")
    assert without_z[4].numel() == 0
    for got, again in zip((du, dk, dskip, dpregate), without_z):
        assert torch.equal(got, again)

    leaves = [t.double().requires_grad_() for t in (u, k, *(t for t in (D, pregate, postgate) if t is not None))]
    it = iter(leaves[2:])
    D64, pre64, post64 = (next(it) if t is not None else None for t in (D, pregate, postgate))
    want_y, want_z = gated_reference(leaves[0], leaves[1], D64, pre64, post64)
    wanted = dict(zip(["u", "k", *(n for n, t in (("D", D), ("pre", pregate), ("post", postgate)) if t is not None)],
                      torch.autograd.grad(want_y, leaves, dy.double())))
    assert du.dtype == u.dtype and rel_l2(du, wanted["u"]) <= 2 * BUDGETS["fp32"]
    assert dk.shape == k.shape and rel_l2(dk, wanted["k"]) <= 2 * BUDGETS["fp32"]
    if D is None:
        assert dskip.numel() == 0
    else:
        assert dskip.shape == D.shape and rel_l2(dskip, wanted["D"]) <= 2 * BUDGETS["fp32"]
    if pregate is None:
        assert dpregate.numel() == 0
    else:
        assert dpregate.shape == u.shape and rel_l2(dpregate, wanted["pre"]) <= 2 * BUDGETS["fp32"]
    if postgate is None:
        assert dpostgate.numel() == 0
    else:
        assert torch.equal(dpostgate, dy * z)
        assert rel_l2(dpostgate, wanted["post"]) <= 2 * BUDGETS["fp32"]


def test_gated_ops_grouped_filters(gen):
    """A grouped spectrum (G rows for C channels): dk has G rows, each its channels' sum."""
    u, k, D, pregate, postgate = inputs(gen, "both", True, channels=6, groups=2)
    y, z, spectrum = ops.gated_fftconv_op(u, k, D, pregate, postgate, "fp32")
    assert spectrum.shape[0] == 2 and rel_l2(y, gated_reference(u, k, D, pregate, postgate)[0]) <= BUDGETS["fp32"]
    dy = randn(gen, *u.shape)
    _, dk, _, _, _ = ops.gated_fftconv_backward_op(dy, u, spectrum, D, pregate, postgate, k.shape[-1], "fp32")
    k64 = k.double().requires_grad_()
    (want,) = torch.autograd.grad(gated_reference(u, k64, D, pregate, postgate)[0], (k64,), dy.double())
    assert dk.shape == k.shape and rel_l2(dk, want) <= 2 * BUDGETS["fp32"]


def test_gated_ops_refuse_gates_unlike_u(gen):
    u, k = randn(gen, 2, 3, 50), randn(gen, 3, 50)
    spectrum = ops.filter_spectrum(k, 50, "fp32")
    with pytest.raises(ValueError, match=r"pregate must have u's shape \(2, 3, 50\) and dtype torch.float32"):
        ops.gated_fftconv_op(u, k, None, randn(gen, 1, 3, 50), None, "fp32")
    with pytest.raises(ValueError, match="postgate must have u's shape"):
        ops.gated_fftconv_backward_op(u, u, spectrum, None, None, u.double(), 50, "fp32")
    with pytest.raises(ValueError, match=r"z \(for dpostgate\) is given only with a postgate.*and no postgate"):
        ops.gated_fftconv_backward_op(u, u, spectrum, None, None, None, 50, "fp32", u)
    with pytest.raises(ValueError, match=r"z \(for dpostgate\).*got \(2, 3, 49\)"):
        ops.gated_fftconv_backward_op(u, u, spectrum, None, None, u, 50, "fp32", u[..., :49])


def test_gated_ops_opcheck(gen):
    """Schemas, fake kernels and the CPU implementations agree (torch.library.opcheck)."""
    u, k, D = randn(gen, 2, 3, 40), randn(gen, 3, 30), randn(gen, 3)
    pregate, postgate = randn(gen, 2, 3, 40), randn(gen, 2, 3, 40)
    spectrum = ops.filter_spectrum(k, 40, "fp32")
    for skip, pre, post in ((None, pregate, None), (D, None, postgate), (D, pregate, postgate)):
        torch.library.opcheck(ops.gated_fftconv, (u, k, skip, pre, post, "fp32"))
        z = None if post is None else randn(gen, 2, 3, 40)
        torch.library.opcheck(ops.gated_fftconv_backward, (randn(gen, 2, 3, 40), u, spectrum, skip, pre, post, 30,
                                                           "fp32", z))


# --------------------------------------------------------------------------- fftconv with the switch on

@pytest.mark.parametrize("gates, with_D, group_share", list(itertools.product(GATES, [False, True], [1, 3])))
def test_fused_training_gradients_match_float64(gates, with_D, group_share, fused_training_on_the_ops, gen):
    """fftconv with the switch on, autograd recording: the gated ops run (one forward, one
    backward), y and the gradients of u, k, D, pregate and postgate within the fp32 budget of
    float64 autograd through the reference; each gradient in its leaf's dtype and shape."""
    channels = 9 if group_share == 3 else 5
    u, k, D, pregate, postgate = inputs(gen, gates, with_D, channels=channels, groups=channels // group_share)
    leaves = [t.requires_grad_() for t in (u, k, D, pregate, postgate) if t is not None]
    y = mf.fftconv(u, k, D=D, pregate=pregate, postgate=postgate)
    want, _ = gated_reference(u, k, D, pregate, postgate)
    assert y.dtype == u.dtype and rel_l2(y, want) <= BUDGETS["fp32"]
    dy = randn(gen, *u.shape)
    got = torch.autograd.grad(y, leaves, dy)
    wanted = torch.autograd.grad(want, leaves, dy.double())
    for leaf, grad, expected in zip(leaves, got, wanted):
        assert grad.dtype == leaf.dtype and grad.shape == leaf.shape
        assert rel_l2(grad, expected) <= 2 * BUDGETS["fp32"]
    assert fused_training_on_the_ops == ["gated_fftconv_op", "gated_fftconv_backward_op"]


@pytest.mark.parametrize("gates", GATES)
def test_dpostgate_in_the_op_gives_the_same_bits(gates, fused_training_on_the_ops, monkeypatch, gen):
    """backends.DPOSTGATE_IN_GRAD_KERNEL on and off: the same y and gradients bit for bit (dy ⊙ z,
    one fp32 multiply, in the op or after it), z handed to the op only when on, with a postgate and
    its gradient asked for."""
    terms = inputs(gen, gates, True, channels=7)
    handed = []
    real = ops.gated_fftconv_backward_op
    monkeypatch.setattr(ops, "gated_fftconv_backward_op", lambda *args: (handed.append(args[8] is not None), real(*args))[1])
    off, on = steps_off_and_on(monkeypatch, "DPOSTGATE_IN_GRAD_KERNEL", terms, randn(gen, *terms[0].shape))
    assert handed == [False, terms[4] is not None]
    for a, b in zip(off, on):
        assert torch.equal(a, b)


def steps_off_and_on(monkeypatch, switch: str, terms, dy) -> list[list[torch.Tensor]]:
    """y and the gradients of every given input of fftconv(u, k, D, pregate, postgate) (terms; D
    given), one training step with backends.<switch> False, then one with it True."""
    u, k, D, pregate, postgate = terms
    results = []
    for on in (False, True):
        monkeypatch.setattr(backends, switch, on)
        leaves = [t.clone().requires_grad_() for t in (u, k, D, pregate, postgate) if t is not None]
        it = iter(leaves[3:])
        pre, post = (next(it) if t is not None else None for t in (pregate, postgate))
        y = mf.fftconv(leaves[0], leaves[1], D=leaves[2], pregate=pre, postgate=post)
        results.append([y, *torch.autograd.grad(y, leaves, dy)])
    return results


@pytest.mark.parametrize("gates", GATES)
def test_switch_on_and_off_agree(gates, monkeypatch, gen):
    """The same training step with backends.FUSED_GATED_TRAINING on and off (the ATen gates):
    the same y and gradients, to fp32 rounding (on the CPU both compose the same ops)."""
    monkeypatch.setenv(backends.BACKEND_ENV, "portable")
    monkeypatch.setattr(backends.Portable, "fuses_gates", True)
    terms = inputs(gen, gates, True)
    off, on = steps_off_and_on(monkeypatch, "FUSED_GATED_TRAINING", terms, randn(gen, *terms[0].shape))
    for a, b in zip(off, on):
        assert rel_l2(b, a) <= 1e-6


@pytest.mark.parametrize("leading", [(), (2, 3)])
def test_leading_dims_and_only_some_leaves(leading, fused_training_on_the_ops, gen):
    """(C, L) and (..., C, L) inputs are flattened to (B, C, L) and back; a step where only the
    gates need gradients gets only theirs."""
    u, k, D, pregate, postgate = inputs(gen, "both", True, batch=6 if leading else 1)
    shape = (*leading, *u.shape[-2:])
    u, pregate, postgate = (t.reshape(shape) for t in (u, pregate, postgate))
    pregate.requires_grad_()
    postgate.requires_grad_()
    y = mf.fftconv(u, k, D=D, pregate=pregate, postgate=postgate)
    want, _ = gated_reference(u, k, D, pregate, postgate)
    assert y.shape == shape and rel_l2(y, want) <= BUDGETS["fp32"]
    dy = randn(gen, *shape)
    got = torch.autograd.grad(y, (pregate, postgate), dy)
    wanted = torch.autograd.grad(want, (pregate, postgate), dy.double())
    for grad, expected in zip(got, wanted):
        assert grad.shape == shape and rel_l2(grad, expected) <= 2 * BUDGETS["fp32"]
    assert fused_training_on_the_ops == ["gated_fftconv_op", "gated_fftconv_backward_op"]


def test_which_calls_take_the_fused_training_step(fused_training_on_the_ops, monkeypatch, gen):
    """Only gated, causal calls that record a gradient, with gates of u's shape and dtype in
    FUSED_GATE_IO_DTYPES: inference keeps the inference op, a broadcast or promoting gate, a
    bf16 call, a bidirectional call and the switch off keep the ATen gates."""
    u, k, D, pregate, postgate = inputs(gen, "both", True)
    trained = k.clone().requires_grad_()

    def forward(**kw):
        fused_training_on_the_ops.clear()
        args = {"D": D, "pregate": pregate, "postgate": postgate} | kw
        mf.fftconv(args.pop("u", u), args.pop("k", trained), **args)
        return list(fused_training_on_the_ops)

    assert forward() == ["gated_fftconv_op"]
    with torch.no_grad():
        assert forward() == ["gated_conv_forward_op"]
    assert forward(pregate=pregate[:1]) == []
    assert forward(postgate=postgate.double()) == []
    assert forward(u=u.bfloat16(), pregate=pregate.bfloat16(), postgate=postgate.bfloat16()) == []
    assert forward(k=torch.stack([trained, trained], dim=1), bidirectional=True) == []
    assert forward(pregate=None, postgate=None) == []
    monkeypatch.setattr(backends, "FUSED_GATED_TRAINING", False)
    assert forward() == []


def test_switch_is_on_by_default():
    """On since its GPU tests passed and it measured faster than the ATen gates (session 22)."""
    assert backends.FUSED_GATED_TRAINING is True
    fused = backends.FusedFP32("cuda-fp32", "", "")
    u, gate, k = torch.ones(1, 1, 4), torch.ones(1, 1, 4), torch.ones(1, 4).requires_grad_()
    assert functional._gated_training_fuses(fused, u, gate, None, k, None, False)
    assert not functional._gated_training_fuses(fused, u, gate, None, k.detach(), None, False)  # no gradient
