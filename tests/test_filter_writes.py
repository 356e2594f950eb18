"""No stale results: every route by which a user writes a filter is seen by the next call, in
eager and compiled code, on CPU and CUDA, inside `inference_cache()` blocks too."""

import copy
import threading

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
    assert all(layer._spectra is None for layer in model if isinstance(layer, mf.FFTConv))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", list(WRITES))
@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_inference_cache_sees_every_write_at_the_next_call(route, mode, device, gen):
    layer = mf.FFTConv(3, 257).to(device)
    x = randn(gen, 2, 3, 257, device=device)
    with mf.inference_cache(layer):
        with mode():
            before = layer(x)  # cached now
        WRITES[route](layer, gen)
        with mode():
            after = layer(x)
        _assert_live(after, layer, x)
        assert not torch.equal(after, before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("length", [4096, 5000])  # N = 8192 and 16384 (the engine's N on request)
def test_inference_cache_write_then_restore_inside_a_block(length, device, gen):
    """The EMA evaluation pattern of issue #37: weights swapped in, used, swapped back."""
    layer = mf.FFTConv(5, length).to(device)
    x = randn(gen, 2, 5, length, device=device)
    ema = _new_values(layer, gen)
    with torch.no_grad(), mf.inference_cache(layer):
        original = layer(x)
        backup = layer.filter.detach().clone()
        layer.filter.data.copy_(ema)
        assert rel_l2(layer(x), reference(x, ema)) <= BUDGETS["fp32"]
        layer.filter.data[2].copy_(backup[2])  # one channel back: only its rows change
        mixed = ema.clone()
        mixed[2] = backup[2]
        assert rel_l2(layer(x), reference(x, mixed)) <= BUDGETS["fp32"]
        layer.filter.data.copy_(backup)
        assert torch.equal(layer(x), original)


def test_inference_cache_exits_by_an_exception_or_a_closed_generator_leave_nothing_behind(gen):
    layer = mf.FFTConv(3, 128)
    x = randn(gen, 1, 3, 128)

    def serve():
        with torch.no_grad(), mf.inference_cache(layer):
            while True:
                yield layer(x)

    outputs = serve()
    first = next(outputs)
    layer.filter.data.mul_(2.0)  # inside the generator's block
    second = next(outputs)
    assert rel_l2(second, 2 * first) <= BUDGETS["fp32"]
    outputs.close()  # GeneratorExit inside the block
    assert layer._spectra is None
    with pytest.raises(KeyboardInterrupt), torch.no_grad(), mf.inference_cache(layer):
        layer(x)
        raise KeyboardInterrupt
    assert layer._spectra is None


def test_inference_cache_threads_share_a_layer(gen):
    """Threads calling one layer inside a block, around writes made between rounds: every call
    is the convolution with the filter of its round."""
    layer = mf.FFTConv(4, 300)
    x = randn(gen, 2, 4, 300)
    with torch.no_grad(), mf.inference_cache(layer):
        for _ in range(3):
            expected = reference(x, layer.filter.detach())
            results: list[torch.Tensor] = []

            def call():
                for _ in range(5):
                    results.append(layer(x))
            threads = [threading.Thread(target=call) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(results) == 20 and all(rel_l2(y, expected) <= BUDGETS["fp32"] for y in results)
            layer.filter.data.add_(_new_values(layer, gen))


@pytest.mark.parametrize("route", ["data.add_", "data.copy_", "Adam fused"])
def test_inference_cache_compiled_calls_see_every_write(route, gen):
    layer = mf.FFTConv(3, 300)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = randn(gen, 2, 3, 300)
    with torch.no_grad(), mf.inference_cache(layer):
        compiled(x)
        WRITES[route](layer, gen)
        _assert_live(compiled(x), layer, x)


def test_inference_cache_keeps_nan_filters_and_gradients(gen):
    """A NaN in the filter is no false change (the comparison is bitwise); a call that records a
    gradient for the filter computes from the live parameter, and the gradient flows."""
    layer = mf.FFTConv(2, 64)
    with torch.no_grad():
        layer.filter[1, 3] = float("nan")
    x = randn(gen, 1, 2, 64)
    with mf.inference_cache(layer):
        with torch.no_grad():
            assert torch.equal(_bits_of(layer(x)), _bits_of(layer(x)))
        y = layer(x)
        y[:, 0].sum().backward()
    assert layer.filter.grad is not None and torch.isfinite(layer.filter.grad[0]).all()
    assert torch.isnan(y[:, 1]).any() and rel_l2(y[:, 0], reference(x[:, :1], layer.filter[:1].detach())[:, 0]) <= 1e-6


def _bits_of(t):
    return t.view(torch.int32)


def test_inference_cache_nests_and_clears_on_errors(gen):
    layer = mf.FFTConv(2, 64)
    x = randn(gen, 1, 2, 64)
    with torch.no_grad(), mf.inference_cache(layer):
        outer = layer._spectra
        with mf.inference_cache(layer):
            assert layer._spectra is outer
            layer(x)
        assert layer._spectra is outer  # the inner block left the outer one's state alone
    assert layer._spectra is None
    with pytest.raises(KeyError), mf.inference_cache(layer):
        raise KeyError("the block's own error propagates")
    assert layer._spectra is None
    with pytest.raises(TypeError, match=r"inference_cache\(model\): model must be a torch.nn.Module, got Parameter"):
        with mf.inference_cache(layer.filter):
            pass


def test_inference_cache_deepcopy_and_state_dict_hold_no_cache(gen):
    layer = mf.FFTConv(2, 64)
    with torch.no_grad(), mf.inference_cache(layer):
        layer(randn(gen, 1, 2, 64))
        assert set(layer.state_dict()) == {"filter"}
    twin = copy.deepcopy(layer)
    assert twin._spectra is None


def test_inference_cache_of_a_model_built_in_inference_mode(gen):
    """Parameters made under inference_mode are inference tensors, which keep no version counter:
    the comparison by content sees their writes all the same."""
    with torch.inference_mode():
        layer = mf.FFTConv(2, 64)
        x = randn(gen, 1, 2, 64)
        with mf.inference_cache(layer):
            before = layer(x)
            assert torch.equal(layer(x), before)
            layer.filter.add_(1.0)
            _assert_live(layer(x), layer, x)


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


# ----------------------------------------------------------------------------- the refresh op


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels, length", [(1, 100), (7, 1000), (37, 4097)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_refresh_recomputes_exactly_the_changed_rows(channels, length, dtype, device, gen):
    """refresh_filter_spectrum (CPU: the reference of the CUDA kernel's contract; CUDA: a bf16/fp16
    filter read as it is, each tap widened): with nothing changed the spectrum is not written at
    all (a poisoned one stays poisoned); after a write to some rows, the spectrum equals a fresh
    one bit for bit and the fp32 source equals the filter's values."""
    from monarch_fftconv import ops
    k = randn(gen, channels, length, device=device).to(dtype)
    source = k.to(torch.float32, copy=True)
    spectrum = ops.filter_spectrum_op(k, length, "fp32")
    poisoned = torch.full_like(spectrum, float("nan"))
    ops.refresh_filter_spectrum_op(k, source, poisoned, length, "fp32")
    assert torch.isnan(poisoned).all(), "an unchanged filter's spectrum was rewritten"
    changed = torch.randperm(channels, generator=gen)[: max(1, channels // 3)].to(device)
    k[changed] = randn(gen, len(changed), length, device=device).to(dtype)
    k[0, -1] = -0.0 if k[0, -1].item() == 0.0 else 0.0  # a change only the bits show, or a value
    ops.refresh_filter_spectrum_op(k, source, spectrum, length, "fp32")
    assert torch.equal(source.view(torch.int32), k.float().view(torch.int32))
    assert torch.equal(spectrum, ops.filter_spectrum_op(k.float(), length, "fp32"))


def test_refresh_op_registration(gen):
    """The refresh op's schema, fake kernel and CPU implementation agree (torch.library.opcheck),
    and it records no autograd history of its own (the low-level library definition)."""
    from monarch_fftconv import ops
    k = randn(gen, 3, 50)
    source, spectrum = torch.zeros_like(k), ops.filter_spectrum_op(torch.zeros_like(k), 50, "fp32")
    checks = torch.library.opcheck(ops.refresh_filter_spectrum_op, (k, source, spectrum, 50, "fp32"),
                                   test_utils=("test_schema", "test_faketensor"))
    assert set(checks.values()) == {"SUCCESS"}
    ops.refresh_filter_spectrum_op(k.requires_grad_(), source, spectrum, 50, "fp32")
    assert not (source.requires_grad or spectrum.requires_grad)
    k = k.detach()
    assert torch.equal(source, k) and torch.equal(spectrum, ops.filter_spectrum_op(k, 50, "fp32"))
