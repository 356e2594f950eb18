"""Finding, building and loading the CUDA extension.

Nothing happens at import. The first CUDA call asks `load()`, which:
1. uses an ahead-of-time build (`monarch_fftconv._C`, see setup.py) if one was installed;
2. otherwise JIT-builds `monarch_fftconv/csrc/` with ninja through torch.utils.cpp_extension (cached on disk);
3. otherwise returns None, and the caller falls back with one warning saying why.

The extension registers `torch.ops.monarch_fftconv_cuda.{conv_forward, supports}`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import shutil
import warnings
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parent / "csrc"
EXTENSION_NAME = "monarch_fftconv_cuda"
BUILD_DIR_ENV = "MONARCH_FFTCONV_BUILD_DIR"
CUTLASS_ENV = "CUTLASS_PATH"

# sm_90a: wgmma/setmaxnreg need the "a" target; the -gencode form also stops torch from
# adding its own arch flags (and a second, plain sm_90 pass).
NVCC_FLAGS = [
    "-gencode=arch=compute_90a,code=sm_90a",
    "-O3",
    "-std=c++20",
    "--expt-relaxed-constexpr",
    "-lineinfo",
    "-DNDEBUG",
]
CXX_FLAGS = ["-O3", "-std=c++20"]


def cutlass_include_dirs() -> list[str]:
    """CUTLASS/CuTe headers: $CUTLASS_PATH (a CUTLASS checkout) or the nvidia-cutlass wheel,
    found with find_spec so that its Python package is never imported."""
    if root := os.environ.get(CUTLASS_ENV):
        dirs = [Path(root) / "include", Path(root) / "tools" / "util" / "include"]
    else:
        spec = importlib.util.find_spec("cutlass_library")
        if spec is None or not spec.submodule_search_locations:
            return []
        source = Path(next(iter(spec.submodule_search_locations))) / "source"
        dirs = [source / "include", source / "tools" / "util" / "include"]
    return [str(d) for d in dirs if d.is_dir()]


def kernel_sources() -> list[Path]:
    return sorted(CSRC.glob("*.cu"))


def unavailable_reason() -> str | None:
    """Why the CUDA kernels cannot be used here, or None if they can be tried."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"the kernels target Hopper (sm_90a); this GPU is sm_{major}{minor}"
    if importlib.util.find_spec("monarch_fftconv._C") is not None:
        return None
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None or shutil.which("nvcc", path=str(Path(CUDA_HOME) / "bin")) is None:
        return "nvcc not found (set CUDA_HOME), and no prebuilt extension is installed"
    if not cutlass_include_dirs():
        return "CUTLASS headers not found: pip install nvidia-cutlass, or set CUTLASS_PATH"
    return None


def build(verbose: bool = False) -> None:
    """JIT-build and load the extension (raises on a compile error)."""
    from torch.utils.cpp_extension import load as jit_load

    build_dir = os.environ.get(BUILD_DIR_ENV)
    if build_dir:
        Path(build_dir).mkdir(parents=True, exist_ok=True)
    jit_load(
        name=EXTENSION_NAME,
        sources=[str(CSRC / "binding.cpp"), *map(str, kernel_sources())],
        extra_include_paths=[str(CSRC), *cutlass_include_dirs()],
        extra_cflags=CXX_FLAGS,
        extra_cuda_cflags=NVCC_FLAGS,
        build_directory=build_dir,
        is_python_module=False,
        verbose=verbose,
    )


@functools.lru_cache(maxsize=None)
def load(verbose: bool = False) -> bool:
    """True once the kernels are registered; False (with one warning) if they can't be."""
    reason = unavailable_reason()
    if reason is None:
        if importlib.util.find_spec("monarch_fftconv._C") is not None:
            importlib.import_module("monarch_fftconv._C")
            return True
        try:
            build(verbose)
            return True
        except Exception as exc:  # a failed build must not take the portable path down with it
            reason = f"building the CUDA extension failed: {exc}"
    warnings.warn(f"monarch_fftconv: CUDA kernels unavailable ({reason}); using the fallback path", stacklevel=3)
    return False


def loaded_reason() -> str | None:
    """Like unavailable_reason(), but after trying to load: None means the kernels are live."""
    return None if load() else (unavailable_reason() or "building the CUDA extension failed")
