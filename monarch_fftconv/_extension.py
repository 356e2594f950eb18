"""Finding, building and loading the CUDA kernels, and what they cover.

Nothing happens at import. The first CUDA call asks `coverage()`, which, once per process:
1. loads an ahead-of-time build (`monarch_fftconv._C`, see setup.py) if one is installed;
2. otherwise JIT-builds `monarch_fftconv/csrc/` (binding.cpp and every .cu of the tree, with
   csrc/ on the include path) with ninja through torch.utils.cpp_extension (cached on disk);
3. otherwise gives a reason, and the caller falls back with one warning saying why.

Loading registers the CUDA implementation of `monarch_fftconv::conv_forward` and the
`monarch_fftconv::_kernel_coverage` query, which is read here once. `coverage(build=False)`
never builds: `explain()` asks that way. The same library is also a Python module, for the one
class it binds (generation's DirectStepper): `python_module()` imports it once it is loaded.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from .planner import MonarchPlan

CSRC = Path(__file__).resolve().parent / "csrc"
EXTENSION_NAME = "monarch_fftconv_cuda"
AOT_MODULE = "monarch_fftconv._C"
BUILD_DIR_ENV = "MONARCH_FFTCONV_BUILD_DIR"
CUTLASS_ENV = "CUTLASS_PATH"
# The kernels' build-time switches (macros named MONARCH_FFTCONV_*, integer values), for side-by-
# side measurements: "NAME=VALUE,NAME=VALUE". Set, the extension is JIT-built with them even where
# a prebuilt one is installed (which has the defaults); give each configuration its own
# MONARCH_FFTCONV_BUILD_DIR to keep both builds cached.
DEFINES_ENV = "MONARCH_FFTCONV_NVCC_DEFINES"

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


@dataclass(frozen=True)
class Coverage:
    """What the loaded kernels cover. A split is (n1, row length) of the planner's plan: the
    shape of the Monarch spectrum the kernels take."""

    splits: frozenset[tuple[int, int]]  # every kernel, tensor-core and fp32 radix
    radix_only_splits: frozenset[tuple[int, int]]  # the fp32 radix kernels only, for every precision
    io_dtypes: frozenset[torch.dtype]  # dtypes of u and y
    fourstep: frozenset[tuple[int, int]] = frozenset()  # the four-step kernels' (N, inner size M)

    def fourstep_covers(self, plan: MonarchPlan, dtype: torch.dtype) -> bool:
        return dtype in self.io_dtypes and any(n == plan.fft_size for n, _ in self.fourstep)

    def kernel_for(self, plan: MonarchPlan, dtype: torch.dtype) -> str | None:
        """"any" (every kernel covers the call), "radix" (only the fp32 radix kernel), or None."""
        split = (plan.n1, plan.row_size)
        if dtype not in self.io_dtypes:
            return None
        return "any" if split in self.splits else "radix" if split in self.radix_only_splits else None

    def fft_sizes(self) -> list[int]:
        return sorted(n1 * n2 for n1, n2 in self.splits | self.radix_only_splits)


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
    """The kernel translation units: every .cu at any depth under csrc/ (fp32/, fourstep/,
    tc/). Their base names are unique across the tree: the JIT build names each object file
    after its source's base name (tests/test_build.py checks)."""
    return sorted(CSRC.rglob("*.cu"))


def binding_sources() -> list[Path]:
    """Everything the extension is built from, binding first."""
    return [CSRC / "binding.cpp", *kernel_sources()]


def build_defines() -> list[str]:
    """The -D flags DEFINES_ENV asks for, checked: each a MONARCH_FFTCONV_ macro the sources test
    with #ifndef, with an integer value. Raises ValueError naming the entry otherwise, so a
    misspelt switch cannot build the defaults under a name that claims otherwise."""
    raw = os.environ.get(DEFINES_ENV, "").strip()
    if not raw:
        return []
    known = _switch_macros()
    values: dict[str, int] = {}
    for entry in filter(None, (e.strip() for e in raw.split(","))):
        name, sep, value = entry.partition("=")
        if not sep or name not in known or not re.fullmatch(r"-?\d+", value.strip()):
            raise ValueError(f"{DEFINES_ENV}: {entry!r} is not NAME=INTEGER with NAME one of "
                             f"{', '.join(sorted(known))}")
        if name in values:
            raise ValueError(f"{DEFINES_ENV}: {name} is given twice")
        values[name] = int(value)
    return [f"-D{name}={value}" for name, value in values.items()]


def _switch_macros() -> frozenset[str]:
    """The build-time switches: the MONARCH_FFTCONV_* macros some source defaults with #ifndef."""
    default = re.compile(r"^#ifndef (MONARCH_FFTCONV_\w+)\s*\n#define \1 ", re.M)
    sources = (p for p in CSRC.rglob("*") if p.suffix in (".cu", ".cuh", ".cpp", ".h"))
    return frozenset(name for path in sources for name in default.findall(path.read_text()))


def _aot_library() -> str | None:
    """Path of the installed ahead-of-time build, if any (none while DEFINES_ENV asks for a
    build of its own)."""
    if os.environ.get(DEFINES_ENV, "").strip():
        return None
    spec = importlib.util.find_spec(AOT_MODULE)
    return spec.origin if spec is not None else None


def unavailable_reason() -> str | None:
    """Why the CUDA kernels cannot be used here, or None if they can be tried."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return f"the kernels target Hopper (sm_90a); this GPU is sm_{major}{minor}"
    if _aot_library() is not None:
        return None
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None or shutil.which("nvcc", path=str(Path(CUDA_HOME) / "bin")) is None:
        return "nvcc not found (set CUDA_HOME), and no prebuilt extension is installed"
    if not cutlass_include_dirs():
        return "CUTLASS headers not found: pip install --no-deps nvidia-cutlass (the headers alone), or set CUTLASS_PATH"
    return None


def build(verbose: bool = False) -> str:
    """JIT-build and load the extension (raises on a compile error); returns its path."""
    from torch.utils.cpp_extension import load as jit_load

    build_dir = os.environ.get(BUILD_DIR_ENV)
    if build_dir:
        Path(build_dir).mkdir(parents=True, exist_ok=True)
    return jit_load(
        name=EXTENSION_NAME,
        sources=[str(p) for p in binding_sources()],
        extra_include_paths=[str(CSRC), *cutlass_include_dirs()],
        extra_cflags=CXX_FLAGS,
        extra_cuda_cflags=[*NVCC_FLAGS, *build_defines()],
        build_directory=build_dir,
        is_python_module=False,
        verbose=verbose,
    )


def _read_coverage() -> Coverage:
    splits, radix_only, fourstep, io_dtypes = torch.ops.monarch_fftconv._kernel_coverage()
    dtypes = frozenset(getattr(torch, name) for name in io_dtypes)
    return Coverage(_pairs(splits), _pairs(radix_only), dtypes, _pairs(fourstep))


def _pairs(flat: list[int]) -> frozenset[tuple[int, int]]:
    return frozenset(zip(flat[0::2], flat[1::2]))


_lock = threading.Lock()
_result: Coverage | str | None = None  # set once per process: the coverage, or why there is none
_library: tuple[str, str] | None = None  # the loaded library: (module name, path)
_module: object = None  # python_module()'s answer once asked: the module, or False


def coverage(build: bool = True) -> Coverage | str | None:
    """The loaded kernels' coverage, or a string saying why no kernel can run here.

    The first call with build=True decides, once per process: it loads or builds the
    extension, or warns once why it can't. With build=False nothing is built (explain() asks
    that way): None then means "not loaded yet; the first CUDA call will build it"."""
    global _result
    if _result is not None:
        return _result
    if not build:
        reason = unavailable_reason()
        if reason is not None or _aot_library() is None:
            return reason
    with _lock:
        if _result is None:
            _result = _load()
    return _result


def _load() -> Coverage | str:
    reason = unavailable_reason()
    if reason is None:
        aot = _aot_library()
        global _library
        try:
            if aot is not None:
                torch.ops.load_library(aot)  # its ops: registered by loading, no module init needed
                _library = (AOT_MODULE, aot)
            else:
                built = build()
                # the module's name is the file's stem: a rebuild in one process is named _v1, _v2, ...
                _library = (Path(built).name.split(".")[0], built)
            return _read_coverage()
        except Exception as exc:  # a failed build must not take the fallback path down with it
            reason = f"{'loading ' + aot if aot else 'building the CUDA extension'} failed: {exc}"
    warnings.warn(f"monarch_fftconv: CUDA kernels unavailable ({reason}); using torch.fft", stacklevel=5)
    return reason


def python_module() -> object | None:
    """The loaded library as a Python module (its pybind11 classes), or None: not loaded (this
    never builds), or a library without the module's init (an older build)."""
    global _module
    if _module is None and _library is not None:
        with _lock:
            if _module is None:
                _module = _import_library(*_library) or False
    return _module or None


def _import_library(name: str, path: str) -> object | None:
    try:
        if name == AOT_MODULE:
            return importlib.import_module(name)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except ImportError:
        return None
