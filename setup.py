"""Optional ahead-of-time build of the CUDA extension.

By default nothing is compiled at install time: the kernels are JIT-built on first use.
Set MONARCH_FFTCONV_BUILD_EXT=1 (and install with --no-build-isolation, so that torch and
nvidia-cutlass are importable here) to compile them into `monarch_fftconv._C` now.
"""

import os

from setuptools import setup

ext_modules, cmdclass = [], {}
if os.environ.get("MONARCH_FFTCONV_BUILD_EXT") == "1":
    import glob
    import importlib.util
    from pathlib import Path

    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    # Same flags as the JIT build; read from the loader without importing the package.
    spec = importlib.util.spec_from_file_location("_ext", Path("monarch_fftconv") / "_extension.py")
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)
    ext_modules = [
        CUDAExtension(
            "monarch_fftconv._C",
            ["monarch_fftconv/csrc/binding.cpp", *sorted(glob.glob("monarch_fftconv/csrc/*.cu"))],
            include_dirs=[str(Path("monarch_fftconv/csrc").resolve()), *loader.cutlass_include_dirs()],
            extra_compile_args={"cxx": loader.CXX_FLAGS, "nvcc": loader.NVCC_FLAGS},
            py_limited_api=False,
        )
    ]
    cmdclass = {"build_ext": BuildExtension.with_options(no_python_abi_suffix=True)}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
