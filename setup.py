"""Optional ahead-of-time build of the CUDA extension.

By default nothing is compiled at install time: the kernels are JIT-built on first use.
Set MONARCH_FFTCONV_BUILD_EXT=1 (and install with --no-build-isolation, so that torch and
nvidia-cutlass are importable here) to compile them into `monarch_fftconv._C` now.
"""

import os

from setuptools import setup

ext_modules, cmdclass = [], {}
if os.environ.get("MONARCH_FFTCONV_BUILD_EXT") == "1":
    import importlib.util
    import sys
    from pathlib import Path

    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    # Same flags and sources as the JIT build, read from the loader without importing the
    # package (registered in sys.modules first: its dataclasses look their module up there).
    spec = importlib.util.spec_from_file_location("_monarch_fftconv_loader", Path("monarch_fftconv") / "_extension.py")
    loader = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loader
    spec.loader.exec_module(loader)
    ext_modules = [
        CUDAExtension(
            "monarch_fftconv._C",
            [str(p.relative_to(Path.cwd().resolve())) for p in loader.binding_sources()],
            include_dirs=[str(Path("monarch_fftconv/csrc").resolve()), *loader.cutlass_include_dirs()],
            extra_compile_args={"cxx": loader.CXX_FLAGS, "nvcc": loader.NVCC_FLAGS},
            py_limited_api=False,
        )
    ]
    cmdclass = {"build_ext": BuildExtension.with_options(no_python_abi_suffix=True)}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
