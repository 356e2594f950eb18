"""No stale results: every route by which a user writes a filter is seen by the next call, in
eager and compiled code, on CPU and CUDA; `inference_cache()` keeps its contract or raises."""

import copy

import pytest
import torch
from torch import nn

import monarch_fftconv as mf
from monarch_fftconv import backends

from helpers import BUDGETS, randn, reference, rel_l2, requires_cuda

DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


def _new_values(layer, gen):
    return randn(gen, *layer.filter.shape, device=layer.filter.device, dtype=layer.filter.dtype)


def _optimizer_step(opt_class, **options):
    def write(layer, gen):
        opt = opt_class(layer.parameters(), lr=0.5, **options)
        layer.filter.grad = _new_values(layer, gen)
        opt.step()
    return write


# Each route writes new values into the live filter of `layer`. Those through `.data`, and fused
# optimizer steps, change no version counter: the stale-cache bug of issue #31.
WRITES = {
    "data.add_": lambda layer, gen: layer.filter.data.add_(1.0),
    "data.lerp_ (EMA)": lambda layer, gen: layer.filter.data.lerp_(_new_values(layer, gen), 0.5),
    "data.mul_(0)": lambda layer, gen: layer.filter.data.mul_(0),
    "data.copy_": lambda layer, gen: layer.filter.data.copy_(_new_values(layer, gen)),
    "data.zero_": lambda layer, gen: layer.filter.data.zero_(),
    "data.clamp_ (clipping)": lambda layer, gen: layer.filter.data.clamp_(-0.1, 0.1),
    "vector_to_parameters": lambda layer, gen: nn.utils.vector_to_parameters(
        _new_values(layer, gen).flatten(), layer.parameters()),
    "no_grad add_": lambda layer, gen: _no_grad(layer.filter.add_, 1.0),
    "load_state_dict": lambda layer, gen: layer.load_state_dict({"filter": _new_values(layer, gen)}),
    "new Parameter": lambda layer, gen: setattr(layer, "filter", nn.Parameter(_new_values(layer, gen))),
    "data = new": lambda layer, gen: setattr(layer.filter, "data", _new_values(layer, gen)),
    "SGD foreach": _optimizer_step(torch.optim.SGD, foreach=True),
    "SGD for-loop": _optimizer_step(torch.optim.SGD, foreach=False),
    "Adam foreach": _optimizer_step(torch.optim.Adam, foreach=True),
    "Adam fused": _optimizer_step(torch.optim.Adam, fused=True),
    "AdamW fused": _optimizer_step(torch.optim.AdamW, fused=True),
}


def _no_grad(fn, *args):
    with torch.no_grad():
        fn(*args)


def _assert_live(y, layer, x):
    """y is the convolution of x with the live filter (exactly zero for a zero filter)."""
    expected = reference(x, layer.filter.detach())
    if expected.abs().max() == 0:  # mul_(0), zero_: exactly zero, not a small residue
        assert y.abs().max().item() == 0
    else:
        assert rel_l2(y, expected) <= BUDGETS["fp32"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", list(WRITES))
@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode, torch.enable_grad])
def test_every_write_is_seen_by_the_next_call(route, mode, device, gen):
    layer = mf.FFTConv(3, 257).to(device)
    x = randn(gen, 2, 3, 257, device=device)
    with mode():
        before = layer(x)  # whatever a call may remember, it has now
    _assert_live(before, layer, x)
    WRITES[route](layer, gen)
    with mode():
        after = layer(x)
    _assert_live(after, layer, x)
    assert not torch.equal(after, before)


@pytest.mark.parametrize("route", ["data.add_", "data.copy_", "vector_to_parameters", "Adam fused"])
def test_compiled_calls_see_every_write(route, gen):
    layer = mf.FFTConv(3, 300)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = randn(gen, 2, 3, 300)
    with torch.no_grad():
        layer(x)
        compiled(x)
    WRITES[route](layer, gen)
    with torch.no_grad():
        _assert_live(compiled(x), layer, x)


def test_averaged_model_follows_its_updates(gen):
    """torch.optim.swa_utils.AveragedModel writes its copy's parameters in place on every update."""
    layer = mf.FFTConv(4, 200)
    averaged = torch.optim.swa_utils.AveragedModel(layer)
    x = randn(gen, 2, 4, 200)
    with torch.no_grad():
        for step in range(3):
            first = averaged(x)
            layer.filter.copy_(_new_values(layer, gen))
            averaged.update_parameters(layer)
            now = averaged(x)
            assert rel_l2(now, reference(x, averaged.module.filter)) <= BUDGETS["fp32"]
            if step > 0:  # the first update copies, later ones average: each changes the filter
                assert not torch.equal(now, first)


# ----------------------------------------------------------------------------- inference_cache


def _count_spectra(monkeypatch):
    calls = []
    for cls in (backends.TorchFFT, backends._MonarchOps):
        original = cls.filter_spectrum

        def counted(self, k, seq_len, precision, _original=original):
            calls.append(seq_len)
            return _original(self, k, seq_len, precision)
        monkeypatch.setattr(cls, "filter_spectrum", counted)
    return calls


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("engine", ["auto", "portable"])
def test_inference_cache_computes_each_spectrum_once(engine, device, monkeypatch, gen):
    monkeypatch.setenv(backends.BACKEND_ENV, engine)
    model = nn.Sequential(mf.FFTConv(3, 300), nn.Identity(), mf.FFTConv(3, 300)).to(device)
    x, short = randn(gen, 2, 3, 300, device=device), randn(gen, 2, 3, 111, device=device)
    with torch.no_grad():
        plain = model(x), model(short)
    calls = _count_spectra(monkeypatch)
    with torch.inference_mode(), mf.inference_cache(model):
        for _ in range(3):
            cached = model(x), model(short)
            assert all(torch.equal(a, b) for a, b in zip(cached, plain))
    assert sorted(calls) == [111, 111, 300, 300]  # per layer and length, once
    assert all(layer._frozen is None for layer in model if isinstance(layer, mf.FFTConv))


@pytest.mark.parametrize("route", ["no_grad add_", "load_state_dict", "new Parameter", "data = new",
                                   "vector_to_parameters", "SGD foreach", "Adam foreach"])
def test_inference_cache_raises_at_the_next_call_on_a_visible_write(route, gen):
    layer = mf.FFTConv(3, 200)
    x = randn(gen, 2, 3, 200)
    with torch.no_grad(), pytest.raises(RuntimeError, match="changed inside an inference_cache"):
        with mf.inference_cache(layer):
            layer(x)
            WRITES[route](layer, gen)
            layer(x)
    with torch.no_grad():  # after the block: the live filter
        _assert_live(layer(x), layer, x)


@pytest.mark.parametrize("device", DEVICES)
# These change no version counter; fused optimizers neither (torch 2.13: Adam(fused=True).step()
# leaves p._version as it was).
@pytest.mark.parametrize("route", ["data.add_", "data.lerp_ (EMA)", "data.copy_", "data.zero_", "data.clamp_ (clipping)",
                                   "Adam fused", "AdamW fused"])
def test_inference_cache_raises_at_exit_on_a_write_through_data(route, device, gen):
    layer = mf.FFTConv(3, 200).to(device)
    x = randn(gen, 2, 3, 200, device=device)
    entry = layer.filter.detach().clone()
    with torch.no_grad(), pytest.raises(RuntimeError, match="written inside an inference_cache"):
        with mf.inference_cache(layer):
            WRITES[route](layer, gen)
            # the block's contract: its calls use the filter as it was on entry
            assert rel_l2(layer(x), reference(x, entry)) <= BUDGETS["fp32"]
    with torch.no_grad():
        _assert_live(layer(x), layer, x)


def test_inference_cache_keeps_nan_filters_and_gradients(gen):
    """A NaN in the filter is no false alarm (the comparison is bitwise); a call that records a
    gradient for the filter computes from the live parameter, and the gradient flows."""
    layer = mf.FFTConv(2, 64)
    with torch.no_grad():
        layer.filter[1, 3] = float("nan")
    x = randn(gen, 1, 2, 64)
    with mf.inference_cache(layer):
        y = layer(x)
        y[:, 0].sum().backward()
    assert layer.filter.grad is not None and torch.isfinite(layer.filter.grad[0]).all()
    assert torch.isnan(y[:, 1]).any() and rel_l2(y[:, 0], reference(x[:, :1], layer.filter[:1].detach())[:, 0]) <= 1e-6


def test_inference_cache_nests_and_clears_on_errors(gen):
    layer = mf.FFTConv(2, 64)
    x = randn(gen, 1, 2, 64)
    with torch.no_grad(), mf.inference_cache(layer):
        outer = layer._frozen
        with mf.inference_cache(layer):
            assert layer._frozen is outer
            layer(x)
        assert layer._frozen is outer  # the inner block left the outer one's state alone
    assert layer._frozen is None
    with pytest.raises(KeyError), mf.inference_cache(layer):
        raise KeyError("the block's own error propagates")
    assert layer._frozen is None


def test_inference_cache_deepcopy_and_state_dict_hold_no_cache(gen):
    layer = mf.FFTConv(2, 64)
    with torch.no_grad(), mf.inference_cache(layer):
        layer(randn(gen, 1, 2, 64))
        assert set(layer.state_dict()) == {"filter"}
    twin = copy.deepcopy(layer)
    assert twin._frozen is None


def test_inference_cache_of_a_model_built_in_inference_mode(gen):
    """Parameters made under inference_mode are inference tensors, which keep no version counter:
    the block still caches, and still catches a write by the bitwise check at its end."""
    with torch.inference_mode():
        layer = mf.FFTConv(2, 64)
        x = randn(gen, 1, 2, 64)
        with pytest.raises(RuntimeError, match="written inside an inference_cache"), mf.inference_cache(layer):
            before = layer(x)
            assert torch.equal(layer(x), before)
            layer.filter.add_(1.0)


def test_inference_cache_blocks_do_not_recompile_a_compiled_model(gen):
    """The graph never reads the cache state, so entering blocks again costs no recompile."""
    layer = mf.FFTConv(2, 96)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = randn(gen, 1, 2, 96)
    with torch.no_grad():
        expected = compiled(x)
        with torch.compiler.set_stance("fail_on_recompile"):
            for _ in range(3):
                with mf.inference_cache(layer):
                    assert torch.equal(compiled(x), expected)
