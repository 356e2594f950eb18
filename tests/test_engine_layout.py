"""The tensor-core engine's integer index maps on the host (tests/engine_layout_check.cu, built
with nvcc, run without a GPU): the swizzled layouts against the PTX 128-byte swizzle and CuTe's
tensors, the wgmma accumulator and register-A fragments against the PTX ISA's layouts, the
mirrored columns' quad exchange, the resident filter's mirrored rows, the hand-off and y
coverage, and the persistent schedule. The program also feeds each checker a deliberately wrong
map and fails unless every one is rejected."""

import shutil
import subprocess
from pathlib import Path

import pytest

from monarch_fftconv import _extension

NVCC = shutil.which("nvcc")
SOURCE = Path(__file__).resolve().parent / "engine_layout_check.cu"

pytestmark = [
    pytest.mark.skipif(NVCC is None, reason="nvcc not installed"),
    pytest.mark.skipif(not _extension.cutlass_include_dirs(), reason="CUTLASS headers not installed (nvidia-cutlass)"),
]


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    exe = tmp_path_factory.mktemp("engine_layout") / "engine_layout_check"
    includes = [f"-I{d}" for d in (_extension.CSRC, *_extension.cutlass_include_dirs())]
    flags = [f for f in _extension.NVCC_FLAGS if f not in ("-lineinfo",)]
    build = subprocess.run([NVCC, *flags, *includes, "-x", "cu", str(SOURCE), "-o", str(exe)],
                           capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr[-4000:]
    return exe


def test_engine_index_maps(checker):
    run = subprocess.run([str(checker)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 failed" in run.stdout
    assert "NOT REJECTED" not in run.stdout and "FAILED" not in run.stdout


TABLES_SOURCE = Path(__file__).resolve().parent / "engine_tables_check.cu"


def test_engine_tables_and_filter_protocol(tmp_path):
    """tests/engine_tables_check.cu: the DFT tables built from their 128 angles are the bits of
    the per-element build (the kernel's own table functions, run on the host), and the resident
    filter's protocol (FilterPlan) against a model of its two mbarriers, with and without the
    early release, reruns included; each checker rejects a deliberately wrong rule."""
    exe = tmp_path / "engine_tables_check"
    includes = [f"-I{d}" for d in (_extension.CSRC, *_extension.cutlass_include_dirs())]
    flags = [f for f in _extension.NVCC_FLAGS if f not in ("-lineinfo",)]
    build = subprocess.run([NVCC, *flags, *includes, f"-I{TABLES_SOURCE.parent}", "-x", "cu", str(TABLES_SOURCE),
                            "-o", str(exe)], capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 failed" in run.stdout and "NOT REJECTED" not in run.stdout and "FAILED" not in run.stdout
