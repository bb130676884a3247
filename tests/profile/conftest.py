"""The recorded Kineto traces of the profiling tests: where they come from, where they are found.

The traces are test data of HolisticTraceAnalysis
(https://github.com/facebookresearch/HolisticTraceAnalysis, MIT licence, copyright Meta Platforms,
Inc. and affiliates), commit ``f4d0062c``, folder ``tests/data``. They are vendored in
``tests/fixtures/kineto/`` with their licence; :data:`KINETO_TRACES` names each file the tests
read, its path in that repository and its SHA-256 (checked before use). Each file is looked up in
order:

1. ``$STEPSCOPE_FIXTURES``: a HolisticTraceAnalysis checkout at that commit, or a folder holding
   the files under the names below (directly or in its ``kineto/``);
2. ``tests/fixtures/kineto`` in this checkout;
3. ``shared/fixtures/kineto`` in the folder that holds this checkout (the development workspace).

A test whose file is found nowhere skips (:func:`kineto_trace`), saying how to get it::

    git clone https://github.com/facebookresearch/HolisticTraceAnalysis hta
    git -C hta checkout f4d0062c
    STEPSCOPE_FIXTURES=$PWD/hta .venv/bin/python -m pytest tests/profile
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
HTA_URL = "https://github.com/facebookresearch/HolisticTraceAnalysis"
HTA_COMMIT = "f4d0062c"

#: name the tests read -> (path in HolisticTraceAnalysis at ``HTA_COMMIT``, SHA-256 of the file)
KINETO_TRACES = {
    "cpu_only.json.gz": (
        "tests/data/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
        "b2ff87b29bd604b0c30bca65915af4388b53a7f421f0897c68a7862e1559b6e5",
    ),
    "cuda_alexnet_2023.json.gz": (
        "tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
        "b9febb1abc8cc729a2890fb6a4171de9867ba72c944437ee046067e7c89912dc",
    ),
    "cuda_multi_stream_event_sync.json.gz": (
        "tests/data/critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz",
        "3e79d573357fd8f764206cc2e514e4a1be4ef43808269689056ed400972ff09c",
    ),
    "cuda_ns_resolution_2024.json.gz": (
        "tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
        "e279d7280e73719e8dd9550e120cfe081fbe268596bd297fe5fcbf63e2b75a09",
    ),
    "cuda_simple_add_2023.json.gz": (
        "tests/data/critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz",
        "8866b9c04126fc8fff1256b6e39851166739913c2cebb0016d8a4f863872fc3f",
    ),
    "cuda_triton_example.json.gz": (
        "tests/data/triton_example/triton_example.json.gz",
        "f1702aba1e49885c42a7bf5ab8b63b82a0d630acd41180d87199401dd202ccfb",
    ),
    "rocm_mi250_minitoy.json.gz": (
        "tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
        "39fdab670f9e80a05ccc6d0d07611b3aeba1092fa10681d8dd08cea48d0488b5",
    ),
}

MISSING = (
    "recorded Kineto traces not found. They are test data of HolisticTraceAnalysis "
    f"({HTA_URL}, MIT licence), commit {HTA_COMMIT}, folder tests/data, not found in "
    f"tests/fixtures/kineto. To run these tests: git clone {HTA_URL} hta && git -C hta checkout "
    f"{HTA_COMMIT}, then set STEPSCOPE_FIXTURES to that checkout (tests/profile/conftest.py "
    "lists the files and their hashes)"
)


def trace_files() -> dict[str, Path]:
    """Each name of :data:`KINETO_TRACES` found somewhere -> its file (first candidate wins)."""
    env = os.environ.get("STEPSCOPE_FIXTURES")
    candidates: list[dict[str, Path]] = []
    if env:
        root = Path(env)
        candidates.append({n: root / p for n, (p, _) in KINETO_TRACES.items()})  # an HTA checkout
        candidates += [{n: d / n for n in KINETO_TRACES} for d in (root / "kineto", root)]
    for folder in (
        REPO_ROOT / "tests" / "fixtures" / "kineto",
        REPO_ROOT.parent / "shared" / "fixtures" / "kineto",
    ):
        candidates.append({n: folder / n for n in KINETO_TRACES})
    found: dict[str, Path] = {}
    for files in candidates:
        for name, path in files.items():
            if name not in found and path.is_file():
                found[name] = path
    return found


@pytest.fixture(scope="session")
def kineto_fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding every trace of :data:`KINETO_TRACES` that was found (hash-checked)."""
    files = trace_files()
    if not files:
        pytest.skip(MISSING)
    out = tmp_path_factory.mktemp("kineto-traces")
    for name, path in files.items():
        want = KINETO_TRACES[name][1]
        got = hashlib.sha256(path.read_bytes()).hexdigest()
        if got != want:
            pytest.fail(
                f"{path} is not {name} of HolisticTraceAnalysis {HTA_COMMIT} "
                f"(sha256 {got[:12]}..., expected {want[:12]}...): check out {HTA_COMMIT}"
            )
        (out / name).symlink_to(path.resolve())
    return out


def kineto_trace(folder: Path, name: str) -> Path:
    """``folder / name``, or skip the test with how to get that one file."""
    path = folder / name
    if not path.exists():
        pytest.skip(f"{name}: {MISSING}")
    return path
