"""The nn.Module: drop-in for the plain torch.fft model, shorter inputs, the precision attribute,
compile and autocast (filter writes and `inference_cache`: test_filter_writes.py)."""

import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import monarch_fftconv as mf

from helpers import BUDGETS, randn, reference, rel_l2


class SeedModel(nn.Module):
    """The plain torch.fft model FFTConv replaces (from the project brief)."""

    def __init__(self, channels, seq_len):
        super().__init__()
        self.channels, self.seq_len, self.fft_size = channels, seq_len, 2 * seq_len
        self.filter = nn.Parameter(torch.randn(channels, seq_len))

    def forward(self, x):
        x_f = torch.fft.rfft(F.pad(x, (0, self.seq_len)), dim=-1)
        k_f = torch.fft.rfft(F.pad(self.filter, (0, self.seq_len)), dim=-1)
        return torch.fft.irfft(x_f * k_f.unsqueeze(0), n=self.fft_size, dim=-1)[..., : self.seq_len]


def test_seed_model_loads_and_matches(gen):
    seed = SeedModel(4, 8192)
    conv = mf.FFTConv(4, 8192)
    conv.load_state_dict(seed.state_dict())
    x = randn(gen, 2, 4, 8192)
    with torch.no_grad():
        expected = reference(x, seed.filter)
        assert rel_l2(seed(x), expected) <= BUDGETS["fp32"]
        assert rel_l2(conv(x), expected) <= BUDGETS["fp32"]
    y = conv(x)  # with autograd
    assert rel_l2(y, expected) <= BUDGETS["fp32"]


def test_same_init_as_seed_model():
    torch.manual_seed(123)
    a = SeedModel(3, 50).filter
    torch.manual_seed(123)
    b = mf.FFTConv(3, 50).filter
    assert torch.equal(a, b)


def test_shorter_inputs(gen):
    conv = mf.FFTConv(3, 1000)
    x = randn(gen, 2, 3, 300)
    with torch.no_grad():
        assert rel_l2(conv(x), reference(x, conv.filter[:, :300])) <= BUDGETS["fp32"]
        full = randn(gen, 2, 3, 1000)  # and the full length again, after the shorter call
        assert rel_l2(conv(full), reference(full, conv.filter)) <= BUDGETS["fp32"]
    with pytest.raises(ValueError, match="exceeds"):
        conv(randn(gen, 2, 3, 1001))


def test_calls_follow_the_parameter(gen):
    conv = mf.FFTConv(3, 512)
    x = randn(gen, 2, 3, 512)
    opt = torch.optim.SGD(conv.parameters(), lr=0.1)
    with torch.no_grad():
        before = conv(x)
        assert torch.equal(conv(x), before)  # deterministic
    loss = conv(x).square().mean()
    loss.backward()
    opt.step()  # in-place update: bumps filter._version
    with torch.no_grad():
        after = conv(x)
        assert not torch.allclose(after, before)
        assert rel_l2(after, reference(x, conv.filter)) <= BUDGETS["fp32"]
        conv.filter.mul_(2.0)  # any in-place change
        assert rel_l2(conv(x), reference(x, conv.filter)) <= BUDGETS["fp32"]
        conv.filter = nn.Parameter(torch.randn(3, 512))  # a new parameter object
        assert rel_l2(conv(x), reference(x, conv.filter)) <= BUDGETS["fp32"]
        conv.filter.data = torch.randn(3, 512)  # new storage behind the same parameter
        assert rel_l2(conv(x), reference(x, conv.filter)) <= BUDGETS["fp32"]
        conv.double()  # dtype change
        assert conv(x.double()).dtype == torch.float64
        assert rel_l2(conv(x.double()), reference(x, conv.filter)) <= 1e-12


def test_module_precision_attribute(portable_engine, gen):
    conv = mf.FFTConv(2, 256, precision="bf16")
    x = randn(gen, 1, 2, 256)
    with torch.no_grad():
        coarse = rel_l2(conv(x), reference(x, conv.filter))
        conv.precision = "fp32"
        exact = rel_l2(conv(x), reference(x, conv.filter))
    assert exact < 1e-5 < 1e-4 < coarse
    with pytest.raises(ValueError):
        mf.FFTConv(2, 256, precision="bf17")


@pytest.mark.parametrize("engine", ["auto", "portable"])
@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_compiled_inference_follows_filter_updates(mode, engine, monkeypatch, gen):
    """torch.compile(fullgraph=True) under no_grad / inference_mode: every call works, also
    inside an inference_cache() block (the graph computes the spectrum), and an in-place filter
    update is seen."""
    monkeypatch.setenv("MONARCH_FFTCONV_BACKEND", engine)
    layer = mf.FFTConv(3, 300)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = randn(gen, 2, 3, 300)
    with mode():
        with mf.inference_cache(layer):
            layer(x)
            for _ in range(3):
                assert rel_l2(compiled(x), reference(x, layer.filter)) <= BUDGETS["fp32"]
        with torch.no_grad():
            layer.filter.mul_(-2.0)
        assert rel_l2(compiled(x), reference(x, layer.filter)) <= BUDGETS["fp32"]
        torch.testing.assert_close(compiled(x), layer(x), rtol=1e-5, atol=1e-5)


def test_module_errors_name_the_modules_terms(gen):
    layer = mf.FFTConv(4, 256)
    with pytest.raises(ValueError, match=r"the input must have shape \(B, 4, L\) .*got \(2, 3, 256\)"):
        layer(randn(gen, 2, 3, 256))
    with pytest.raises(TypeError, match="the input must be a real floating-point tensor"):
        layer(torch.ones(2, 4, 256, dtype=torch.int64))
    with pytest.raises(ValueError, match="exceeds the module's seq_len"):
        layer(randn(gen, 2, 4, 300))
    y = layer(randn(gen, 4, 256))  # unbatched (C, L), as the plain model accepts
    assert y.shape == (4, 256)


@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16])
def test_autocast_keeps_the_precision_policy(autocast_dtype, gen):
    """Under autocast a call follows the precision policy of its input's dtype (fp32 for a
    float32 input), not autocast's: the result keeps the input's dtype and the fp32 budget,
    forward and backward. Activations that autocast made bf16 take the bf16 path."""
    layer = mf.FFTConv(3, 400)
    x = randn(gen, 2, 3, 400).requires_grad_()
    with torch.autocast("cpu", dtype=autocast_dtype):
        y = layer(x)
        y.square().sum().backward()
        half = layer(x.detach().to(torch.bfloat16))
    assert y.dtype == torch.float32 and half.dtype == torch.bfloat16
    assert rel_l2(y, reference(x, layer.filter)) <= BUDGETS["fp32"]
    assert rel_l2(half, reference(x, layer.filter)) <= BUDGETS["bf16"] + 2.0**-8
    assert x.grad is not None and torch.isfinite(layer.filter.grad).all()


PACKAGE_SOURCE = re.compile(r"monarch_fftconv[/\\][\w/\\]*\.py")


def warns_about_the_package(w: warnings.WarningMessage) -> bool:
    """Raised by the package's code, or by torch about it: Dynamo's warnings name the traced
    line ("... at '.../monarch_fftconv/functional.py:42'"). Torch's warnings about itself
    (torch 2.11's "torch.jit.script_method is deprecated", raised while compiling) are not."""
    return PACKAGE_SOURCE.search(w.filename) is not None or PACKAGE_SOURCE.search(str(w.message)) is not None


def test_the_warning_filter_keeps_the_packages_own():
    def warning(message: str, filename: str) -> warnings.WarningMessage:
        return warnings.WarningMessage(message, UserWarning, filename, 1)
    torch_file = torch.__file__
    assert not warns_about_the_package(warning("`torch.jit.script_method` is deprecated", torch_file))
    assert warns_about_the_package(warning("anything", mf.functional.__file__))
    assert warns_about_the_package(warning("Dynamo detected a call to a `functools.lru_cache`-wrapped function at "
                                           f"'{mf.functional.__file__}:42'", torch_file))


def test_compiling_warns_nothing(gen, recwarn):
    """A compiled forward and backward raise no warning about the package: Dynamo warned about
    the planner's lru_cache on every compile before (issue #31)."""
    torch._dynamo.reset()  # a fresh compile, not one cached by an earlier test
    layer = mf.FFTConv(3, 333)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    x = randn(gen, 2, 3, 333).requires_grad_()
    compiled(x).sum().backward()
    assert x.grad is not None
    assert [f"{w.filename}:{w.lineno}: {w.message}" for w in recwarn if warns_about_the_package(w)] == []


@pytest.mark.parametrize("shape, hint", [((2, 8, 100), False), ((2, 12, 50), False), ((2, 100, 4), True),
                                         ((3, 2, 100), False), ((100,), False)])
def test_module_takes_its_own_channel_count_only(shape, hint, gen):
    """FFTConv(channels=4) refuses any other channel count, a multiple of its filters too (it
    is not taken as grouped filters), and names the (B, L, C) mix-up where it looks like one."""
    layer = mf.FFTConv(4, 100)
    expected = re.escape(f"the input must have shape (B, 4, L) or (..., 4, L) with L <= 100 (FFTConv channels=4), "
                         f"got {shape}")
    with pytest.raises(ValueError, match=expected) as refused:
        layer(randn(gen, *shape))
    assert ("it looks like (B, L, C)" in str(refused.value)) == hint


def test_module_groups_come_from_groups(gen):
    """A grouped module takes its channel count, each filter serving C // G channels, and
    refuses an input with as many channels as it has filters."""
    layer = mf.FFTConv(6, 50, groups=2)
    x = randn(gen, 3, 6, 41)
    want = reference(x, layer.filter.detach()[:, :41].repeat_interleave(3, 0))
    assert rel_l2(layer(x), want) <= BUDGETS["fp32"]
    with pytest.raises(ValueError, match=r"FFTConv channels=6\), got \(3, 2, 41\)"):
        layer(randn(gen, 3, 2, 41))
