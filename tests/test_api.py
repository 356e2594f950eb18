"""Public API: errors, the precision policy, explain, and the nn.Module."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import monarch_fftconv as mf
from monarch_fftconv import policy

from conftest import BUDGETS, randn, reference, rel_l2


def test_public_api_is_small():
    assert set(mf.__all__) == {"FFTConv", "PRECISIONS", "explain", "fftconv", "precision"}
    assert mf.PRECISIONS == ("fp32", "tf32", "bf16", "fp16")


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("u_shape, k_shape, exc, match", [
    ((4, 100), (4, 100), ValueError, r"u must have shape \(B, C, L\)"),
    ((2, 4, 100), (4, 100, 1), ValueError, r"k must have shape \(C, Lk\)"),
    ((2, 4, 100), (3, 100), ValueError, "channel mismatch"),
    ((2, 4, 100), (4, 101), ValueError, "filter longer than the sequence"),
    ((0, 4, 100), (4, 10), ValueError, "empty dimension"),
    ((2, 4, 100), (4, 0), ValueError, "empty dimension"),
])
def test_bad_shapes(u_shape, k_shape, exc, match):
    with pytest.raises(exc, match=match):
        mf.fftconv(torch.randn(u_shape), torch.randn(k_shape))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.complex64, torch.bool])
def test_bad_dtypes(dtype):
    good = torch.randn(2, 3, 10)
    bad = torch.ones(2, 3, 10).to(dtype)
    with pytest.raises(TypeError, match="u must be a real floating-point"):
        mf.fftconv(bad, torch.randn(3, 10))
    with pytest.raises(TypeError, match="k must be a real floating-point"):
        mf.fftconv(good, bad[0])


def test_bad_precision_and_types():
    u, k = torch.randn(2, 3, 10), torch.randn(3, 10)
    with pytest.raises(ValueError, match="precision must be one of"):
        mf.fftconv(u, k, precision="fp8")
    with pytest.raises(TypeError, match="u must be a torch.Tensor"):
        mf.fftconv(u.tolist(), k)
    with pytest.raises(ValueError, match=r"D must have shape \(3,\)"):
        mf.fftconv(u, k, D=torch.randn(4))
    with pytest.raises(ValueError):
        mf.precision("int8").__enter__()


def test_different_devices():
    u, k = torch.randn(2, 3, 10), torch.randn(3, 10, device="meta")
    with pytest.raises(ValueError, match="different devices"):
        mf.fftconv(u, k)


# --------------------------------------------------------------------------- precision policy

def test_policy_resolution_order(monkeypatch):
    f32, bf16 = torch.float32, torch.bfloat16
    monkeypatch.delenv(policy.ENV_VAR, raising=False)
    assert policy.resolve(None, f32)[0] == "fp32"
    assert policy.resolve(None, bf16)[0] == "bf16"
    assert policy.resolve(None, torch.float16)[0] == "fp16"
    monkeypatch.setenv(policy.ENV_VAR, "tf32")
    assert policy.resolve(None, f32) == ("tf32", f"the {policy.ENV_VAR} environment variable")
    assert policy.resolve(None, f32, "fp16")[0] == "fp16"  # module attribute beats the env var
    with mf.precision("bf16"):
        assert policy.resolve(None, f32, "fp16")[0] == "bf16"  # context beats the module
        with mf.precision("fp32"):
            assert policy.resolve(None, f32)[0] == "fp32"  # innermost wins
        assert policy.resolve("tf32", f32)[0] == "tf32"  # the call argument beats everything
    assert policy.resolve(None, f32)[0] == "tf32"  # context restored
    monkeypatch.setenv(policy.ENV_VAR, "fp64")
    with pytest.raises(ValueError, match=policy.ENV_VAR):
        policy.resolve(None, f32)


def test_precision_flag_changes_the_result(gen):
    u, k = randn(gen, 2, 3, 1000), randn(gen, 3, 1000)
    ref = reference(u, k)
    exact = rel_l2(mf.fftconv(u, k), ref)
    with mf.precision("bf16"):
        coarse = rel_l2(mf.fftconv(u, k), ref)
    assert exact < 1e-5 < 1e-4 < coarse < BUDGETS["bf16"]


@pytest.fixture
def hopper_kernels(monkeypatch):
    """Pretend the CUDA extension loaded with the kernels' coverage: the decision is then
    checkable without a GPU."""
    from monarch_fftconv import _extension, backends

    splits = frozenset((n1, n2) for n1, n2 in [(16, 16), (32, 16), (32, 32), (64, 32), (64, 64), (128, 64), (128, 128)])
    coverage = _extension.Coverage(splits, frozenset({torch.float32, torch.bfloat16, torch.float16}))
    monkeypatch.setattr(_extension, "coverage", lambda build=True: coverage)
    monkeypatch.setattr(backends, "_decisions", {})
    return backends


@pytest.mark.parametrize("precision, name", [("fp32", "cuda-fp32"), ("bf16", "cuda-tensor-core")])
def test_gpu_calls_a_kernel_covers_take_it(hopper_kernels, precision, name):
    from monarch_fftconv.planner import plan_for

    for length in (129, 1000, 8192):
        backend = hopper_kernels.select_backend(torch.device("cuda", 0), torch.float32, precision, plan_for(length))
        assert backend.name == name
        assert hopper_kernels.select_backend(torch.device("cuda", 0), torch.float32, precision, plan_for(length)) is backend


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("length, dtype, why", [(8193, torch.float32, "N=32768"), (100, torch.float64, "float64"),
                                                (64, torch.float32, "N=128")])
def test_gpu_calls_no_kernel_covers_take_cufft(hopper_kernels, length, dtype, why, precision):
    from monarch_fftconv.planner import plan_for

    backend = hopper_kernels.select_backend(torch.device("cuda", 0), dtype, precision, plan_for(length))
    assert backend.name == "torch.fft" and why in backend.reason


def test_gpu_without_kernels_takes_cufft_and_explain_never_builds(monkeypatch):
    from monarch_fftconv import _extension, backends
    from monarch_fftconv.planner import plan_for

    monkeypatch.setattr(backends, "_decisions", {})
    monkeypatch.setattr(_extension, "_result", None)
    monkeypatch.setattr(_extension, "unavailable_reason", lambda: None)
    monkeypatch.setattr(_extension, "_aot_library", lambda: None)
    monkeypatch.setattr(_extension, "build", lambda: pytest.fail("explain() must not build"))
    pending = backends.select_backend(torch.device("cuda", 0), torch.float32, "fp32", plan_for(1000), build=False)
    assert pending.name == "pending" and pending.flops(plan_for(1000), 1, 1) is None
    assert backends._decisions == {}  # not remembered: the real call decides

    monkeypatch.setattr(_extension, "unavailable_reason", lambda: "nvcc not found")
    backend = backends.select_backend(torch.device("cuda", 0), torch.float32, "fp32", plan_for(1000), build=False)
    assert backend.name == "torch.fft" and "nvcc not found" in backend.reason


def test_explain_says_where_and_why(monkeypatch):
    monkeypatch.delenv(policy.ENV_VAR, raising=False)
    u, k = torch.randn(2, 3, 8192), torch.randn(3, 8192)
    info = mf.explain(u, k)
    assert info["backend"] == "portable" and info["precision"] == "fp32"
    assert info["fft_size"] == 16384 and info["factors"] == (128, 128)
    assert "default" in info["precision_source"] and "cpu" in info["reason"]
    assert info["flops"] > 0
    with mf.precision("bf16"):
        assert mf.explain(u, k)["precision_source"].startswith("the monarch_fftconv.precision")
    assert mf.explain(u.bfloat16(), k)["precision"] == "bf16"
    with pytest.raises(ValueError):
        mf.explain(u, k, precision="nope")


# --------------------------------------------------------------------------- nn.Module

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


def test_inference_cache_follows_the_parameter(gen):
    conv = mf.FFTConv(3, 512)
    x = randn(gen, 2, 3, 512)
    opt = torch.optim.SGD(conv.parameters(), lr=0.1)
    with torch.no_grad():
        before = conv(x)
        assert torch.equal(conv(x), before)  # cached, same result
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


def test_module_precision_attribute(gen):
    conv = mf.FFTConv(2, 256, precision="bf16")
    x = randn(gen, 1, 2, 256)
    with torch.no_grad():
        coarse = rel_l2(conv(x), reference(x, conv.filter))
        conv.precision = "fp32"
        exact = rel_l2(conv(x), reference(x, conv.filter))
    assert exact < 1e-5 < 1e-4 < coarse
    with pytest.raises(ValueError):
        mf.FFTConv(2, 256, precision="bf17")


def test_import_has_no_global_side_effects():
    import subprocess
    import sys

    code = (
        "import torch; s = torch.random.get_rng_state().clone();"
        "import monarch_fftconv;"
        "assert torch.equal(s, torch.random.get_rng_state()), 'RNG touched';"
        "import sys; assert 'monarch_fftconv_cuda' not in str(torch.ops.loaded_libraries)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_toolchain_falls_back_with_one_warning(monkeypatch):
    from monarch_fftconv import _extension

    monkeypatch.setattr(_extension, "unavailable_reason", lambda: "nvcc not found (set CUDA_HOME)")
    monkeypatch.setattr(_extension, "_result", None)
    with pytest.warns(UserWarning, match="nvcc not found") as record:
        assert _extension.coverage() == "nvcc not found (set CUDA_HOME)"
        assert _extension.coverage() == "nvcc not found (set CUDA_HOME)"  # decided once: no second warning
    assert len(record) == 1


def test_failed_build_falls_back_with_one_warning_saying_what_failed(monkeypatch):
    from monarch_fftconv import _extension

    def broken_build(verbose=False):
        raise RuntimeError("nvcc: error: something is wrong")

    monkeypatch.setattr(_extension, "unavailable_reason", lambda: None)
    monkeypatch.setattr(_extension, "_aot_library", lambda: None)
    monkeypatch.setattr(_extension, "build", broken_build)
    monkeypatch.setattr(_extension, "_result", None)
    with pytest.warns(UserWarning, match="building the CUDA extension failed: nvcc: error") as record:
        reason = _extension.coverage()
        assert _extension.coverage() is reason
    assert len(record) == 1 and "something is wrong" in reason


def test_cutlass_path_override(monkeypatch, tmp_path):
    from monarch_fftconv import _extension

    (tmp_path / "include").mkdir()
    monkeypatch.setenv(_extension.CUTLASS_ENV, str(tmp_path))
    assert _extension.cutlass_include_dirs() == [str(tmp_path / "include")]
