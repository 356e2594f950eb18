"""cuDNN's FFT causal convolution through its C API (libcudnn_ext.so.9, cuDNN >= 9.26), by ctypes.

Why: the frontend's cudnn.ops.fft_causal_conv1d binds to the libcudnn torch has already loaded,
so it refuses where torch bundles an older cuDNN (the GPU machine's torch 2.11 has 9.19). The
FFT convolution lives in libcudnn_ext.so.9, which needs no other cuDNN library: loaded by path
from a newer cuDNN's kit, it runs next to torch's.

The C functions (cudnn_subquadratic_ops.h; x (B, D, L), weight (D, K), y, dy, dx (B, D, L) and
dweight (D, K), all contiguous, one dtype; y[t] = Σ_j weight[j]·x[t−j]):
  medium path, K a power of two in [128, 16384] (16384 on compute capability >= 9.0), L % K == 0:
    cudnnFFTCausalConv1dForward(stream, x, w, y, B, D, L, K, dtype)
    cudnnFFTCausalConv1dBackward(stream, x, w, dy, dx, dw, B, D, L, K, dtype)
  long path, L == K a power of two in [4096, 2^24]:
    cudnnLongFFTCausalConv1dGetBufferSizes(B, D, L, K, dtype, &workspace_bytes, &reserve_bytes)
    cudnnLongFFTCausalConv1dForward(stream, x, w, y, B, D, L, K, dtype, ws, ws_bytes, rs, rs_bytes)
    cudnnLongFFTCausalConv1dBackward(stream, dy, dx, dw, B, D, L, K, dtype, ws, ws_bytes, rs, rs_bytes)
  (the reserve space is written by the forward and read by its backward).
Every function returns a cudnnStatus_t, 0 on success; any other becomes CudnnError, named for the
function, with cudnnGetErrorString's text (a libcudnn.so.9 function: libcudnn_ext has none).

A kit is a folder with lib/libcudnn_ext.so.9 (and lib/libcudnn.so.9) and include/ holding the
cuFFTDx headers: ../shared/tools/cudnn_kit.sh builds one. Its kernels are compiled by NVRTC on the
first call per shape (8-42 s), which needs CUDNN_CUFFTDX_INCLUDE_DIR, CUDNN_CUTLASS_INCLUDE_DIR
and CUDA_HOME (open_kit sets those that are unset).
"""
from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

Tensor = torch.Tensor
Loader = Callable[..., ctypes.CDLL]   # ctypes.CDLL(path, mode=...)

# cudnnDataType_t
CUDNN_DATA_TYPES: Dict[torch.dtype, int] = {torch.float32: 0, torch.float64: 1,
                                            torch.float16: 2, torch.bfloat16: 9}
MEDIUM_MIN_KERNEL = 128
LONG_MIN_KERNEL = 4096
LONG_MAX_KERNEL = 1 << 24


class CudnnError(RuntimeError):
    """A cuDNN C function returned a status other than CUDNN_STATUS_SUCCESS."""

    def __init__(self, function: str, status: int, text: str):
        super().__init__(f"{function} failed: {text} (cudnnStatus_t {status})")
        self.function, self.status, self.text = function, status, text


_size_p = ctypes.POINTER(ctypes.c_size_t)
_INT5 = [ctypes.c_int] * 5   # B, D, L, K, dtype
_BUFFERS = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]  # ws, bytes, rs, bytes
_SIGNATURES: Dict[str, List[type]] = {
    "cudnnFFTCausalConv1dForward": [ctypes.c_void_p] * 4 + _INT5,
    "cudnnFFTCausalConv1dBackward": [ctypes.c_void_p] * 6 + _INT5,
    "cudnnLongFFTCausalConv1dGetBufferSizes": _INT5 + [_size_p, _size_p],
    "cudnnLongFFTCausalConv1dForward": [ctypes.c_void_p] * 4 + _INT5 + _BUFFERS,
    "cudnnLongFFTCausalConv1dBackward": [ctypes.c_void_p] * 4 + _INT5 + _BUFFERS,
}


class FFTCausalConv1dLibrary:
    """The five functions of a loaded libcudnn_ext, typed; a failing status raises CudnnError.
    Pointers and the stream are ints (device addresses, cudaStream_t)."""

    def __init__(self, ext: ctypes.CDLL, error_string: Callable[[int], str], path: str = "?"):
        self.path = path
        self._error_string = error_string
        self._functions = {}
        for name, argtypes in _SIGNATURES.items():
            function = getattr(ext, name)   # AttributeError names a missing symbol
            function.argtypes, function.restype = argtypes, ctypes.c_int
            self._functions[name] = function

    def _call(self, name: str, *args) -> None:
        status = self._functions[name](*args)
        if status != 0:
            raise CudnnError(name, status, self._error_string(status))

    def forward(self, stream: int, x: int, w: int, y: int, batch: int, dim: int, length: int,
                kernel_size: int, dtype: int) -> None:
        self._call("cudnnFFTCausalConv1dForward", stream, x, w, y, batch, dim, length, kernel_size,
                   dtype)

    def backward(self, stream: int, x: int, w: int, dy: int, dx: int, dw: int, batch: int,
                 dim: int, length: int, kernel_size: int, dtype: int) -> None:
        self._call("cudnnFFTCausalConv1dBackward", stream, x, w, dy, dx, dw, batch, dim, length,
                   kernel_size, dtype)

    def long_buffer_sizes(self, batch: int, dim: int, length: int, kernel_size: int,
                          dtype: int) -> Tuple[int, int]:
        """(workspace bytes, reserve-space bytes) of the long path."""
        workspace, reserve = ctypes.c_size_t(), ctypes.c_size_t()
        self._call("cudnnLongFFTCausalConv1dGetBufferSizes", batch, dim, length, kernel_size, dtype,
                   ctypes.byref(workspace), ctypes.byref(reserve))
        return workspace.value, reserve.value

    def long_forward(self, stream: int, x: int, w: int, y: int, batch: int, dim: int, length: int,
                     kernel_size: int, dtype: int, workspace: int, workspace_bytes: int,
                     reserve: int, reserve_bytes: int) -> None:
        self._call("cudnnLongFFTCausalConv1dForward", stream, x, w, y, batch, dim, length,
                   kernel_size, dtype, workspace, workspace_bytes, reserve, reserve_bytes)

    def long_backward(self, stream: int, dy: int, dx: int, dw: int, batch: int, dim: int,
                      length: int, kernel_size: int, dtype: int, workspace: int,
                      workspace_bytes: int, reserve: int, reserve_bytes: int) -> None:
        self._call("cudnnLongFFTCausalConv1dBackward", stream, dy, dx, dw, batch, dim, length,
                   kernel_size, dtype, workspace, workspace_bytes, reserve, reserve_bytes)


def _error_strings(candidates: Sequence[str], loader: Loader) -> Callable[[int], str]:
    """cudnnGetErrorString of the first of `candidates` (paths or sonames) that loads and has it."""
    for candidate in candidates:
        try:
            function = getattr(loader(candidate, mode=ctypes.RTLD_GLOBAL), "cudnnGetErrorString")
        except (OSError, AttributeError):
            continue
        function.argtypes, function.restype = [ctypes.c_int], ctypes.c_char_p

        def text(status: int, _function=function) -> str:
            raw = _function(status)
            return raw.decode(errors="replace") if raw else "no error string"
        return text
    return lambda status: f"no cudnnGetErrorString in {', '.join(candidates) or 'any library'}"


def open_library(ext_path: str, error_string_from: Sequence[str] = (),
                 loader: Loader = ctypes.CDLL) -> FFTCausalConv1dLibrary:
    """libcudnn_ext.so.9 at `ext_path`, its errors told by cudnnGetErrorString of the first of
    `error_string_from` that has it. Raises OSError (no such library) or AttributeError (a
    function missing: a cuDNN older than 9.26)."""
    ext = loader(ext_path, mode=ctypes.RTLD_GLOBAL)
    return FFTCausalConv1dLibrary(ext, _error_strings(error_string_from, loader), ext_path)


# ------------------------------------------------------------------------------------- the kit

def _cutlass_include() -> Optional[str]:
    """The CUTLASS headers of the nvidia-cutlass wheel, if it is installed."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or spec.origin is None:
        return None
    include = Path(spec.origin).parent / "source" / "include"
    return str(include) if include.is_dir() else None


def open_kit(kit: str, loader: Loader = ctypes.CDLL) -> FFTCausalConv1dLibrary:
    """The library of a kit folder, with the environment its JIT compilation reads (variables
    already set are kept) and NVRTC loaded first, as cuDNN expects it in the process. Raises
    FileNotFoundError saying what is missing."""
    root = Path(kit)
    ext = root / "lib" / "libcudnn_ext.so.9"
    if not ext.is_file():
        raise FileNotFoundError(f"no {ext} (a kit holds lib/libcudnn_ext.so.9 and include/; "
                                f"../shared/tools/cudnn_kit.sh builds one)")
    os.environ.setdefault("CUDNN_CUFFTDX_INCLUDE_DIR", str(root / "include"))
    cutlass = os.environ.get("CUDNN_CUTLASS_INCLUDE_DIR") or _cutlass_include()
    if cutlass is None:
        raise FileNotFoundError("no CUTLASS headers for cuDNN's JIT: pip install --no-deps "
                                "nvidia-cutlass, or set CUDNN_CUTLASS_INCLUDE_DIR")
    os.environ["CUDNN_CUTLASS_INCLUDE_DIR"] = cutlass
    cuda_home = os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")
    for nvrtc in sorted(glob.glob(os.path.join(cuda_home, "lib64", "libnvrtc.so*")))[:1]:
        loader(nvrtc, mode=ctypes.RTLD_GLOBAL)
    # The error strings: torch's libcudnn if loaded (found by soname), else the kit's.
    return open_library(str(ext), ("libcudnn.so.9", str(root / "lib" / "libcudnn.so.9")), loader)


# ----------------------------------------------------------------------------------- for torch

def stream_handle(t: Tensor) -> int:
    """The cudaStream_t the call runs on: the current stream of t's device (0 on the host)."""
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def kernel_size_for(length: int) -> int:
    """The power of two the convolution runs at: L rounded up, at least the medium path's least."""
    return max(MEDIUM_MIN_KERNEL, 1 << (length - 1).bit_length())


def medium_max_kernel(device: torch.device) -> int:
    """The medium path's largest K: 16384 on compute capability >= 9.0, else 8192."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] < 9:
        return 8192
    return 16384


def path_for(kernel_size: int, medium_max: int) -> str:
    """'medium' or 'long': the medium path where it takes K (as the frontend prefers), else long."""
    if kernel_size <= medium_max:
        return "medium"
    if kernel_size > LONG_MAX_KERNEL:
        raise ValueError(f"cuDNN's FFT causal convolution takes L up to {LONG_MAX_KERNEL}, "
                         f"not {kernel_size}")
    return "long"


def _bytes(nbytes: int, like: Tensor) -> Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=like.device)


class _FFTCausalConv1d(torch.autograd.Function):
    """y = causal conv(x, w) with x (B, D, L), w (D, L), L the kernel size (a power of two)."""

    @staticmethod
    def forward(ctx, library: FFTCausalConv1dLibrary, path: str, x: Tensor, w: Tensor) -> Tensor:
        x, w = x.contiguous(), w.contiguous()
        B, D, L = x.shape
        dtype = CUDNN_DATA_TYPES[x.dtype]
        y = torch.empty_like(x)
        stream = stream_handle(x)
        ctx.library, ctx.path = library, path
        if path == "medium":
            library.forward(stream, x.data_ptr(), w.data_ptr(), y.data_ptr(), B, D, L, L, dtype)
            ctx.save_for_backward(x, w)
            return y
        workspace_bytes, reserve_bytes = library.long_buffer_sizes(B, D, L, L, dtype)
        # The workspace is scratch for this call; the reserve holds the spectra its backward reads.
        workspace, reserve = _bytes(workspace_bytes, x), _bytes(reserve_bytes, x)
        library.long_forward(stream, x.data_ptr(), w.data_ptr(), y.data_ptr(), B, D, L, L, dtype,
                             workspace.data_ptr(), workspace_bytes, reserve.data_ptr(), reserve_bytes)
        ctx.save_for_backward(reserve)
        ctx.shape, ctx.workspace_bytes = (B, D, L), workspace_bytes
        return y

    @staticmethod
    def backward(ctx, dy: Tensor):
        dy = dy.contiguous()
        B, D, L = dy.shape
        dtype = CUDNN_DATA_TYPES[dy.dtype]
        dx = torch.empty_like(dy)
        # Zeroed: the header does not say whether dweight is written or added to (the non-FFT
        # convolution's is added to).
        dw = torch.zeros(D, L, dtype=dy.dtype, device=dy.device)
        stream = stream_handle(dy)
        if ctx.path == "medium":
            x, w = ctx.saved_tensors
            ctx.library.backward(stream, x.data_ptr(), w.data_ptr(), dy.data_ptr(), dx.data_ptr(),
                                 dw.data_ptr(), B, D, L, L, dtype)
        else:
            (reserve,) = ctx.saved_tensors
            workspace = _bytes(ctx.workspace_bytes, dy)
            ctx.library.long_backward(stream, dy.data_ptr(), dx.data_ptr(), dw.data_ptr(), B, D, L, L,
                                      dtype, workspace.data_ptr(), ctx.workspace_bytes,
                                      reserve.data_ptr(), reserve.numel())
        return None, None, dx, dw


def fft_causal_conv1d(library: FFTCausalConv1dLibrary, x: Tensor, weight: Tensor,
                      path: Optional[str] = None) -> Tensor:
    """y[..., t] = Σ_j weight[:, j]·x[..., t−j] for x (B, D, L) and weight (D, L) of one dtype,
    differentiable. L other than a power of two >= 128 is zero-padded up to one (the causal
    outputs are unchanged), as the frontend does; `path` forces 'medium' or 'long'."""
    if x.dtype != weight.dtype or x.dim() != 3 or weight.shape != x.shape[1:]:
        raise ValueError(f"x (B, D, L) and weight (D, L) of one dtype, not {tuple(x.shape)} "
                         f"{x.dtype} and {tuple(weight.shape)} {weight.dtype}")
    length = x.shape[-1]
    kernel_size = kernel_size_for(length)
    path = path or path_for(kernel_size, medium_max_kernel(x.device))
    if kernel_size != length:
        x = F.pad(x, (0, kernel_size - length))
        weight = F.pad(weight, (0, kernel_size - length))
    y = _FFTCausalConv1d.apply(library, path, x, weight)
    return y if kernel_size == length else y[..., :length]
