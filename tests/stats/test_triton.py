"""The fused Triton kernel (spine + histogram in one read), on the CPU through Triton's interpreter:
counts bit for bit equal to the C kernel, float fields within summation-order round-off.

Triton picks interpreter or compiler when it is imported, so the cases
(``triton_interpreted_cases.py``) run in a subprocess with ``TRITON_INTERPRET=1``. Skipped where
Triton does not install; on a GPU, ``benchmarks/gpu/gpu_check.sh`` runs the compiled kernel
(``tests/stats/test_cuda.py`` compares CUDA rows with CPU rows).
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("triton_interpreted_cases.py")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_triton_kernel_matches_the_c_kernel_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(CASES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert " passed" in res.stdout and "failed" not in res.stdout
