"""CPU tests of the cudnn method's C-API route (benchmarks/fftconv_bench/cudnn_capi.py), against a
TEST DOUBLE of cuDNN's libcudnn_ext.so.9 (tests/cudnn_ext_double.c, compiled here with gcc): it
records every call's arguments, checks them as cuDNN's header states, and computes the
convolution on the host memory of CPU tensors. The real library runs on the GPU machine only."""
import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_ROOT = Path(__file__).resolve().parents[1]
_BENCHMARKS = _ROOT / "benchmarks"
if str(_BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(_BENCHMARKS))

from fftconv_bench import cudnn_capi  # noqa: E402

STREAM = 0x5EED0   # what the tests make stream_handle return: the binding must pass it on


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """A fake kit folder: lib/libcudnn_ext.so.9 and lib/libcudnn.so.9 built from the double."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the test double of libcudnn_ext")
    root = tmp_path_factory.mktemp("cudnn_kit")
    (root / "lib").mkdir()
    (root / "include").mkdir()
    source = str(_ROOT / "tests" / "cudnn_ext_double.c")
    for name, flags in (("libcudnn_ext.so.9", []), ("libcudnn.so.9", ["-DERROR_STRINGS_ONLY"])):
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", *flags, "-o", str(root / "lib" / name), source],
                       check=True, capture_output=True, timeout=120)
    return root


@pytest.fixture
def double(kit, monkeypatch):
    """The double's recording (the handle ctypes gets is the library the binding loaded) and a
    binding of it; stream_handle returns STREAM."""
    recorder = ctypes.CDLL(str(kit / "lib" / "libcudnn_ext.so.9"))
    recorder.double_call.restype = ctypes.c_char_p
    recorder.double_reset()
    monkeypatch.setattr(cudnn_capi, "stream_handle", lambda t: STREAM)
    library = cudnn_capi.open_library(str(kit / "lib" / "libcudnn_ext.so.9"),
                                      (str(kit / "lib" / "libcudnn.so.9"),))

    def calls():
        """[(function, {argument: int})] of the calls since the reset, in order."""
        parsed = []
        for i in range(recorder.double_call_count()):
            name, *fields = recorder.double_call(i).decode().split()
            args = dict(field.split("=") for field in fields)
            parsed.append((name, {k: 0 if v == "(nil)" else int(v, 0) for k, v in args.items()}))
        return parsed
    yield library, calls, recorder
    recorder.double_reset()


def _causal_conv64(x, w, dy=None):
    """y, or (y, dx, dw) with dy, in float64 by torch.fft: the reference."""
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    n = 2 * x.shape[-1]
    y = torch.fft.irfft(torch.fft.rfft(x64, n=n) * torch.fft.rfft(w64, n=n), n=n)[..., :x.shape[-1]]
    if dy is None:
        return y.detach()
    return (y.detach(), *torch.autograd.grad(y, (x64, w64), dy.double()))


def _rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def _inputs(B, D, L, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(B, D, L, generator=gen)
    w = torch.randn(D, L, generator=gen) / L ** 0.5
    dy = torch.randn(B, D, L, generator=gen)
    return x.to(dtype), w.to(dtype), dy.to(dtype)


def test_forward_passes_shapes_pointers_dtype_and_stream(double):
    library, calls, _ = double
    x, w, _ = _inputs(2, 3, 256)
    y = cudnn_capi.fft_causal_conv1d(library, x, w)
    (name, args), = calls()
    assert name == "cudnnFFTCausalConv1dForward"
    assert args == {"stream": STREAM, "x": x.data_ptr(), "w": w.data_ptr(), "y": y.data_ptr(),
                    "B": 2, "D": 3, "L": 256, "K": 256, "dtype": 0}
    assert _rel(y, _causal_conv64(x, w)) < 1e-6


def test_strided_inputs_go_in_contiguous(double):
    """The C API takes no strides: a transposed view must reach it as a contiguous copy."""
    library, calls, _ = double
    x, w, _ = _inputs(3, 2, 128)
    strided_x, strided_w = x.transpose(0, 1).contiguous().transpose(0, 1), w.t().contiguous().t()
    assert not strided_x.is_contiguous() and not strided_w.is_contiguous()
    y = cudnn_capi.fft_causal_conv1d(library, strided_x, strided_w)
    (_, args), = calls()
    assert args["x"] != strided_x.data_ptr() and args["w"] != strided_w.data_ptr()
    assert _rel(y, _causal_conv64(x, w)) < 1e-6


@pytest.mark.parametrize("dtype, code, tolerance", [(torch.float32, 0, 1e-6), (torch.bfloat16, 9, 2 ** -7)])
def test_training_step_on_the_medium_path(double, dtype, code, tolerance):
    """Forward then backward, the backward given the forward's x and w, dy as it is, and dx and dw
    it returns; dw starts from zero each step (the double adds into it)."""
    library, calls, _ = double
    x, w, dy = _inputs(2, 3, 256, dtype)
    x.requires_grad_(), w.requires_grad_()
    for _ in range(2):
        y = cudnn_capi.fft_causal_conv1d(library, x, w)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
    assert [name for name, _ in calls()] == ["cudnnFFTCausalConv1dForward", "cudnnFFTCausalConv1dBackward"] * 2
    _, backward = calls()[-1]
    assert backward == {"stream": STREAM, "x": x.data_ptr(), "w": w.data_ptr(), "dy": dy.data_ptr(),
                        "dx": dx.data_ptr(), "dw": dw.data_ptr(), "B": 2, "D": 3, "L": 256, "K": 256,
                        "dtype": code}
    assert y.dtype == dx.dtype == dw.dtype == dtype
    for got, want in zip((y, dx, dw), _causal_conv64(x.detach(), w.detach(), dy)):
        assert _rel(got, want) < tolerance


def test_long_path_passes_its_buffers_and_the_forwards_reserve(double):
    library, calls, _ = double
    x, w, dy = _inputs(1, 2, 4096)
    x.requires_grad_(), w.requires_grad_()
    y = cudnn_capi.fft_causal_conv1d(library, x, w, path="long")
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    (sizes_call, sizes), (forward_call, forward), (backward_call, backward) = calls()
    assert (sizes_call, forward_call, backward_call) == ("cudnnLongFFTCausalConv1dGetBufferSizes",
                                                         "cudnnLongFFTCausalConv1dForward",
                                                         "cudnnLongFFTCausalConv1dBackward")
    shape = {"B": 1, "D": 2, "L": 4096, "K": 4096, "dtype": 0}
    assert sizes == shape
    assert forward == {"stream": STREAM, "x": x.data_ptr(), "w": w.data_ptr(), "y": y.data_ptr(), **shape,
                       "workspace": forward["workspace"], "workspace_bytes": 2 * 2 * 4096 + 64,
                       "reserve": forward["reserve"], "reserve_bytes": 8 * (1 * 2 + 2) * 4096}
    assert backward["reserve"] == forward["reserve"] and backward["reserve_bytes"] == forward["reserve_bytes"]
    assert backward["workspace_bytes"] == forward["workspace_bytes"] and backward["workspace"] != 0
    assert (backward["dy"], backward["dx"], backward["dw"]) == (dy.data_ptr(), dx.data_ptr(), dw.data_ptr())
    for got, want in zip((y, dx, dw), _causal_conv64(x.detach(), w.detach(), dy)):
        assert _rel(got, want) < 1e-6


def test_lengths_other_than_powers_of_two_run_zero_padded(double):
    library, calls, _ = double
    x, w, dy = _inputs(2, 2, 200)
    x.requires_grad_(), w.requires_grad_()
    y = cudnn_capi.fft_causal_conv1d(library, x, w)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    assert [(args["L"], args["K"]) for _, args in calls()] == [(256, 256)] * 2
    assert y.shape == dx.shape == x.shape and dw.shape == w.shape
    for got, want in zip((y, dx, dw), _causal_conv64(x.detach(), w.detach(), dy)):
        assert _rel(got, want) < 1e-6


def test_path_choice():
    assert cudnn_capi.kernel_size_for(100) == 128 and cudnn_capi.kernel_size_for(4096) == 4096
    assert cudnn_capi.kernel_size_for(5000) == 8192
    assert cudnn_capi.path_for(16384, 16384) == "medium" and cudnn_capi.path_for(16384, 8192) == "long"
    assert cudnn_capi.path_for(1 << 20, 16384) == "long"
    with pytest.raises(ValueError, match="up to"):
        cudnn_capi.path_for(1 << 25, 16384)


def test_a_failing_status_raises_with_the_function_and_cudnns_text(double):
    library, calls, recorder = double
    x, w, _ = _inputs(1, 1, 128)
    recorder.double_fail_next(3000)
    with pytest.raises(cudnn_capi.CudnnError) as raised:
        cudnn_capi.fft_causal_conv1d(library, x, w)
    assert str(raised.value) == ("cudnnFFTCausalConv1dForward failed: CUDNN_STATUS_NOT_SUPPORTED "
                                 "(cudnnStatus_t 3000)")
    # An argument cuDNN rejects (the long path below L = 4096): the size query fails, nothing runs.
    with pytest.raises(cudnn_capi.CudnnError, match="cudnnLongFFTCausalConv1dGetBufferSizes failed: "
                                                    "CUDNN_STATUS_BAD_PARAM"):
        cudnn_capi.fft_causal_conv1d(library, x, w, path="long")
    assert [name for name, _ in calls()] == ["cudnnFFTCausalConv1dForward",
                                             "cudnnLongFFTCausalConv1dGetBufferSizes"]


def test_without_cudnnGetErrorString_the_error_still_names_function_and_status(kit, double):
    _, _, recorder = double
    library = cudnn_capi.open_library(str(kit / "lib" / "libcudnn_ext.so.9"), (str(kit / "missing.so"),))
    recorder.double_fail_next(2000)
    with pytest.raises(cudnn_capi.CudnnError, match=r"cudnnFFTCausalConv1dForward failed: no "
                                                    r"cudnnGetErrorString in .*missing.so \(cudnnStatus_t 2000\)"):
        cudnn_capi.fft_causal_conv1d(library, *_inputs(1, 1, 128)[:2])


def test_a_library_without_the_functions_is_refused(kit):
    with pytest.raises(AttributeError, match="cudnnFFTCausalConv1dForward"):
        cudnn_capi.open_library(str(kit / "lib" / "libcudnn.so.9"))


@pytest.fixture
def jit_environment(monkeypatch, tmp_path):
    """The variables open_kit sets, cleared (and restored after the test); no CUDA here."""
    for name in ("CUDNN_CUFFTDX_INCLUDE_DIR", "CUDNN_CUTLASS_INCLUDE_DIR"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no_cuda"))


def test_open_kit_sets_what_cudnns_jit_reads(kit, jit_environment, monkeypatch):
    monkeypatch.setattr(cudnn_capi, "_cutlass_include", lambda: "/cutlass/include")
    library = cudnn_capi.open_kit(str(kit))
    assert library.path == str(kit / "lib" / "libcudnn_ext.so.9")
    assert os.environ["CUDNN_CUFFTDX_INCLUDE_DIR"] == str(kit / "include")
    assert os.environ["CUDNN_CUTLASS_INCLUDE_DIR"] == "/cutlass/include"


def test_open_kit_says_what_is_missing(kit, tmp_path, jit_environment, monkeypatch):
    with pytest.raises(FileNotFoundError, match="libcudnn_ext.so.9"):
        cudnn_capi.open_kit(str(tmp_path))
    monkeypatch.setattr(cudnn_capi, "_cutlass_include", lambda: None)
    with pytest.raises(FileNotFoundError, match="CUTLASS"):
        cudnn_capi.open_kit(str(kit))


# ------------------------------------------------------------- the benchmark's cudnn method

@pytest.fixture
def capi_route(kit, jit_environment, monkeypatch):
    """The benchmark as on the GPU machine: no usable frontend, the kit named by the variable."""
    from fftconv_bench import methods
    monkeypatch.setattr(methods, "CUDNN_DEVICES", ("cuda", "cpu"))
    monkeypatch.setitem(sys.modules, "cudnn", None)   # import cudnn fails
    monkeypatch.setenv("CUDNN_CUTLASS_INCLUDE_DIR", "/cutlass/include")
    monkeypatch.setenv(methods.CUDNN_KIT_ENV, str(kit))
    return methods


@pytest.mark.parametrize("io_dtype", ["float32", "bfloat16"])
def test_benchmark_rows_through_the_c_api(capi_route, tmp_path, io_dtype):
    from fftconv_bench import cli, guard
    by = {m.name: m for m in capi_route.make_methods("cpu", backward=True)}
    assert by["cudnn"].unavailable is None and by["cudnn"].entry == capi_route.CUDNN_CAPI_ENTRY
    res = cli.main(["--quick", "--device", "cpu", "--no-plots", "--backward", "--io-dtype", io_dtype,
                    "--shapes", "1x2x256", "--methods", "reference,cudnn,cudnn.backward",
                    "--out", str(tmp_path)])
    rows = {r["method"]: r for r in res["rows"]}
    bound = 1e-5 if io_dtype == "float32" else 2 ** -7
    for name in ("cudnn", "cudnn.backward"):
        r = rows[name]
        assert r["status"] == "ok", r.get("error")
        assert r["entry"] == capi_route.CUDNN_CAPI_ENTRY and r["io_dtype"] == io_dtype
        assert "medium path, K=256" in r["kernel"] and "libcudnn_ext.so.9" in r["kernel"]
        assert max(r["rel_err"], r["grad_u_rel_err"], r["grad_k_rel_err"]) < bound
        assert guard.is_accurate(r) and r["first_call_s"] > 0
    assert json.loads((tmp_path / "results.json").read_text())["skipped"] == []


def test_frontend_first_where_it_runs(capi_route, monkeypatch):
    frontend = type(sys)("cudnn")
    frontend.backend_version = lambda: 92700
    frontend.ops = type(sys)("ops")
    frontend.ops.fft_causal_conv1d = lambda x, weight: x
    monkeypatch.setitem(sys.modules, "cudnn", frontend)
    assert capi_route.cudnn_convolution("cpu").entry == "cudnn.ops.fft_causal_conv1d"


def test_without_either_route_the_skip_says_both_reasons(capi_route, tmp_path, monkeypatch):
    monkeypatch.setenv(capi_route.CUDNN_KIT_ENV, str(tmp_path / "no_kit"))
    why = capi_route.cudnn_convolution("cpu").unavailable
    assert "pip install nvidia-cudnn-cu13" in why and "no_kit/lib/libcudnn_ext.so.9" in why
    monkeypatch.delenv(capi_route.CUDNN_KIT_ENV)
    why = capi_route.cudnn_convolution("cpu").unavailable
    assert f"or set {capi_route.CUDNN_KIT_ENV}" in why
    assert capi_route.cudnn_convolution("cpu", "no gates").unavailable == "no gates"
