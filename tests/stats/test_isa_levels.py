"""Every instruction-set clone of the C kernel gives the same bits, on any x86-64 machine.

The packaged library carries x86-64-v4, x86-64-v3 and baseline clones and the loader picks one
by the CPU it runs on, so a test suite that passes on one machine says nothing about the clones
another machine picks (a fresh clone's suite once failed on an AVX2-only CPU: the fused spine +
histogram path and the per-tensor path gave different float sums on the v3 clone). Here
``STEPSCOPE_KERNEL_ISA`` builds each level this CPU can run, and in a child process per level

- the kernels' own equivalence tests (fused vs per-tensor, C vs pure torch) and the collector's
  boundary equivalence test (fast and plain step boundaries store the same bytes) pass, and
- the spines and histograms of adversarial tensors hash to the same bytes on every level with
  FMA (x86-64-v3, x86-64-v4: the same fixed lanes, the same fused multiply-adds) as the
  dispatching (packaged) library's; the baseline clone, which has no FMA, differs from them only
  within the documented float64 bound, which ``tests/stats/test_exactness.py`` checks on it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepscope.stats import _native, backend_info

ROOT = Path(__file__).resolve().parents[2]

HASH_SCRIPT = r"""
import hashlib, sys
import torch
from stepscope.stats import HistogramDescriptor, backend_info, reduce_histograms, reduce_spines
from stepscope.stats import spines_into, SPINE_WIDTH
from tests.stats.test_multitensor import DESCRIPTORS, histogram_tensors

assert backend_info()["cpu"] == "c", backend_info()
digest = hashlib.sha256()
ts = histogram_tensors()
for t in ts:
    digest.update(reduce_spines([t], backend="c")[0].numpy().tobytes())
for desc in DESCRIPTORS.values():
    out = torch.zeros((len(ts), SPINE_WIDTH), dtype=torch.float64)
    hist = torch.zeros((len(ts), desc.width), dtype=torch.int64)
    spines_into(ts, out, list(range(len(ts))), "c", hist=hist, descriptor=desc)
    digest.update(out.numpy().tobytes())
    digest.update(hist.numpy().tobytes())
    for t in ts:
        digest.update(reduce_histograms([t], desc, backend="c")[0].numpy().tobytes())
print(backend_info()["isa"], digest.hexdigest())
"""


def _levels() -> list[str]:
    if backend_info()["cpu"] != "c" or backend_info()["source"] != "packaged":
        pytest.skip("needs the packaged C kernel: " + backend_info()["detail"])
    try:
        top = _native._cpu_level()
    except (OSError, RuntimeError) as exc:
        pytest.skip(f"no dispatching library to ask the CPU level: {exc}")
    return [name for name, (_march, code) in _native.LEVELS.items() if code <= top]


def _env(tmp_path: Path, level: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPSCOPE_KERNEL")}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]), OMP_NUM_THREADS="1")
    env["STEPSCOPE_CACHE"] = str(tmp_path / "cache")
    if level is not None:
        env["STEPSCOPE_KERNEL_ISA"] = level
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800
    )


#: levels whose clone fuses multiply-adds (the same bits as each other)
FMA_LEVELS = ("v3", "v4")


def test_every_fma_level_hashes_to_the_dispatching_librarys_bytes(tmp_path):
    levels = _levels()
    assert "baseline" in levels
    packaged = _run(["-c", HASH_SCRIPT], _env(tmp_path, None))
    assert packaged.returncode == 0, packaged.stderr[-2000:]
    packaged_isa, want = packaged.stdout.rsplit(maxsplit=1)
    if "fma" not in packaged_isa:
        pytest.skip(f"this CPU's clone has no FMA ({packaged_isa}): nothing to compare bitwise")
    checked = 0
    for level in (lv for lv in levels if lv in FMA_LEVELS):
        got = _run(["-c", HASH_SCRIPT], _env(tmp_path, level))
        assert got.returncode == 0, (level, got.stderr[-2000:])
        isa, digest = got.stdout.rsplit(maxsplit=1)
        assert isa.startswith("x86-64-" + level), (level, isa)  # the level really ran
        assert digest == want, (level, isa)
        checked += 1
    assert checked >= 1


def test_the_kernels_equivalence_and_accuracy_tests_pass_on_every_level(tmp_path):
    levels = _levels()
    # and the collector's fast and plain step boundaries store the same bytes (the test that
    # once failed on an AVX2-only CPU: the native many-row and per-row paths on the v3 clone)
    files = [
        "tests/stats/test_multitensor.py",
        "tests/stats/test_exactness.py",
        "tests/collect/test_boundary_equivalence.py",
    ]
    for level in levels[:-1]:  # the top one is what the packaged library runs in this suite
        done = _run(
            ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *files], _env(tmp_path, level)
        )
        assert done.returncode == 0, (level, done.stdout[-3000:])


def test_a_level_the_name_does_not_know_is_refused(tmp_path):
    code = "from stepscope.stats import _native; _native.load()"
    done = _run(["-c", code], _env(tmp_path, "v9"))
    assert done.returncode != 0 and "STEPSCOPE_KERNEL_ISA='v9'" in done.stderr
