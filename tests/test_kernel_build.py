"""Every kernel translation unit compiles for sm_90a (CI has nvcc but no GPU).

Uses the loader's own flags and include paths, calling nvcc directly on the torch-free
.cu files (a CPU-only torch cannot drive cpp_extension builds)."""

import shutil
import subprocess

import pytest

from monarch_fftconv import _extension

NVCC = shutil.which("nvcc")
SOURCES = _extension.kernel_sources()


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.skipif(not _extension.cutlass_include_dirs(), reason="CUTLASS headers not installed (nvidia-cutlass)")
@pytest.mark.parametrize("source", SOURCES, ids=[s.name for s in SOURCES])
def test_kernel_compiles(source, tmp_path):
    includes = [f"-I{d}" for d in (_extension.CSRC, *_extension.cutlass_include_dirs())]
    cmd = [NVCC, *_extension.NVCC_FLAGS, *includes, "-c", str(source), "-o", str(tmp_path / "k.o")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]


def test_kernel_sources_are_torch_free():
    """Kernel units include no torch header: they compile ~10x faster that way."""
    for path in [*SOURCES, *_extension.CSRC.glob("*.cuh"), *_extension.CSRC.glob("*.h")]:
        text = path.read_text()
        assert "#include <torch" not in text and "#include <ATen" not in text, path.name
