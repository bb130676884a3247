"""Builds the fused C kernels (``src/stepscope/stats/_kernels.c``) into the wheel at install time.

The result is a plain shared library that :mod:`stepscope.stats._native` loads with ctypes (no
Python C API). Portable flags only (never ``-march=native``); on x86-64 Linux the hot loops carry
``target_clones`` so the x86-64-v4 (AVX-512 + FMA), x86-64-v3 (AVX2 + FMA) or baseline version is
chosen at run time (AVX-512F/AVX2/baseline with GCC before 12). ``#pragma omp simd``
needs ``-fopenmp-simd`` only: no OpenMP runtime is linked beside torch's. The extension is
optional: where no C compiler exists the install still succeeds and stepscope runs its pure-torch
kernels (``stepscope.stats.backend_info()`` says so).
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# -fno-wrapv: Python's own CFLAGS carry -fwrapv, which stops GCC vectorising the loops (5-10x slower)
UNIX_FLAGS = ["-O3", "-fno-wrapv", "-std=c11", "-fno-math-errno", "-fopenmp-simd", "-pthread"]


class BuildKernels(build_ext):
    """Compiler-specific flags (the GCC/Clang ones above; MSVC gets its own optimisation flag)."""

    def build_extensions(self) -> None:
        unix = self.compiler.compiler_type != "msvc"
        for ext in self.extensions:
            ext.extra_compile_args = UNIX_FLAGS if unix else ["/O2"]
            ext.extra_link_args = ["-pthread"] if unix else []
        super().build_extensions()


setup(
    ext_modules=[
        Extension(
            "stepscope.stats._stepscope_kernels",
            sources=["src/stepscope/stats/_kernels.c"],
            libraries=["m"],
            optional=True,
        )
    ],
    cmdclass={"build_ext": BuildKernels},
)
