"""A real install carries the compiled kernel: build a wheel from a clean copy of the sources,
install it into a fresh virtualenv and ask that interpreter which backend runs.

Also: the kernel library links no OpenMP runtime, carries no ``-march=native`` code path by
default, and the JIT build is an explicit opt-in whose cache key includes the CPU.
"""

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
import torch

from stepscope.stats import _native

ROOT = Path(__file__).resolve().parents[2]
PIP = [sys.executable, "-m", "pip"]


def clean_copy(dst: Path) -> Path:
    """The files a fresh clone has (no build outputs, no compiled library)."""
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dst / name)
    shutil.copytree(
        ROOT / "src",
        dst / "src",
        ignore=shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info"),
    )
    return dst


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = clean_copy(tmp_path_factory.mktemp("clone"))
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run(
        [*PIP, "wheel", str(src), "-w", str(out), "--no-deps", "--no-build-isolation", "-q"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (whl,) = out.glob("stepscope-*.whl")
    return whl


def test_wheel_contains_the_compiled_kernel_and_its_source(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert any(
        n.startswith("stepscope/stats/_stepscope_kernels") and n.endswith(".so") for n in names
    )
    assert "stepscope/stats/_kernels.c" in names  # for the explicit JIT opt-in


def test_fresh_virtualenv_from_the_wheel_runs_the_packaged_native_kernel(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    py = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    # torch and numpy from this interpreter (a plain path entry: no .pth in it is executed, so
    # the editable stepscope of the test environment stays invisible)
    deps = {str(Path(torch.__file__).parents[1]), sysconfig.get_paths()["purelib"]}
    (site / "deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", wheel],
        check=True,
        capture_output=True,
        timeout=300,
    )
    probe = (
        "import json, torch, stepscope\n"
        "from stepscope.stats import backend_info, reduce_spines\n"
        "x = torch.randn(10000)\n"
        "same = torch.equal(reduce_spines([x]), reduce_spines([x], backend='c'))\n"
        "print(json.dumps({'file': stepscope.__file__, 'info': backend_info(), 'same': same}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "STEPSCOPE"))}
    res = subprocess.run(
        [py, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert Path(got["file"]).resolve().is_relative_to(env_dir.resolve())  # the wheel, not src/
    assert got["info"]["cpu"] == "c" and got["info"]["source"] == "packaged", got["info"]
    assert got["same"]
    assert "RuntimeWarning" not in res.stderr


def test_the_kernel_library_links_no_openmp_runtime():
    info = _native.backend_info()
    if info["cpu"] != "c":
        pytest.skip(info["detail"])
    lib = Path(str(_native._STATE["path"]))
    ldd = shutil.which("ldd")
    if ldd is None:
        pytest.skip("no ldd")
    linked = subprocess.run([ldd, lib], capture_output=True, text=True).stdout
    assert "gomp" not in linked and "libomp" not in linked and "iomp" not in linked


def test_jit_is_opt_in_and_keys_its_cache_on_the_cpu_when_native(monkeypatch, tmp_path):
    flags = _native._jit_flags()
    assert "-march=native" not in flags and "-march=native" not in " ".join(_native._FLAGS)
    monkeypatch.setenv("STEPSCOPE_NATIVE_ARCH", "1")
    assert "-march=native" in _native._jit_flags()
    built: list[Path] = []
    monkeypatch.setattr(_native, "_compile", lambda target, flags: built.append(target))
    monkeypatch.setenv("STEPSCOPE_CACHE", str(tmp_path))
    monkeypatch.setattr(_native, "_cpu_fingerprint", lambda: "cpu A")
    a = _native._jit_library()
    monkeypatch.setattr(_native, "_cpu_fingerprint", lambda: "cpu B")
    b = _native._jit_library()
    assert a != b and built == [a, b]  # a home shared across CPU types never reuses a build


def test_missing_packaged_library_falls_back_with_a_warning(monkeypatch):
    monkeypatch.setattr(_native, "_STATE", {})
    monkeypatch.setattr(_native, "_EXTENSION", "stepscope.stats._no_such_kernel")
    monkeypatch.delenv("STEPSCOPE_KERNEL", raising=False)
    with pytest.warns(RuntimeWarning, match="not installed"):
        assert _native.load() is None
    info = _native.backend_info()
    assert info["cpu"] == "torch" and info["source"] == "none"
    monkeypatch.setattr(_native, "_STATE", {})
    monkeypatch.setenv("STEPSCOPE_KERNEL", "c")
    with pytest.raises(RuntimeError, match="not installed"):
        _native.load()


def test_run_record_names_the_kernel_backend(tmp_path):
    from stepscope import open_run
    from stepscope.collect import HistoryCollector, WatchSettings

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    col = HistoryCollector(model, settings=WatchSettings(output_dir=str(tmp_path / "run")))
    with col.step(opt):
        model(torch.randn(5, 4)).sum().backward()
        opt.step()
    col.close()
    recorded = open_run(tmp_path / "run").run.extra["kernel_backend"]
    assert recorded == _native.backend_info() and recorded["cpu"] in ("c", "torch")


def exported_by_the_source() -> set[str]:
    """Functions ``_kernels.c`` gives external linkage: plain definitions at column 0 and the
    names its ``*_ENTRY`` macros define (everything else in the file is ``static``)."""
    text = (ROOT / "src/stepscope/stats/_kernels.c").read_text()
    plain = re.findall(r"^(?:void|int|double|int64_t)\s+(stepscope_\w+)\(", text, re.M)
    entries = re.findall(r"^(?:SPINE|HIST)_ENTRY\((stepscope_\w+),", text, re.M)
    return set(plain) | set(entries)


def test_every_export_of_the_kernel_is_bound_and_nothing_else_is():
    source = exported_by_the_source()
    assert "stepscope_spine_merge" in source and "stepscope_hist_f32" in source  # parser works
    assert source == set(_native.EXPORTS)
    info = _native.backend_info()
    if info["cpu"] != "c":
        pytest.skip(info["detail"])
    lib = _native.load()
    for name, (argtypes, restype) in _native.EXPORTS.items():
        fn = getattr(lib, name)
        assert (fn.argtypes, fn.restype) == (argtypes, restype), name
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm to read the dynamic symbol table")
    table = subprocess.run(
        [nm, "-D", "--defined-only", str(_native._STATE["path"])], capture_output=True, text=True
    ).stdout
    dynamic = {line.split()[-1] for line in table.splitlines() if " T " in line}
    assert dynamic == set(_native.EXPORTS)


def build_variant(tmp_path: Path, name: str, extra: list[str]) -> ctypes.CDLL:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    out = tmp_path / f"{name}.so"
    src = ROOT / "src/stepscope/stats/_kernels.c"
    subprocess.run(
        [cc, *_native._FLAGS, *extra, str(src), "-o", str(out), "-lm"], check=True, timeout=120
    )
    return _native._bind(ctypes.CDLL(str(out)))


def test_baseline_build_without_dispatch_counts_like_the_dispatched_clones(tmp_path):
    """The portable build (no target clones: plain x86-64 or whatever the platform's baseline
    is, no FMA) gives the dispatched library's counts, extremes and histograms bit for bit and
    its sums to float64 round-off (FMA contraction and nothing else may differ)."""
    info = _native.backend_info()
    if info["cpu"] != "c":
        pytest.skip(info["detail"])
    from stepscope.stats import SPINE_WIDTH, HistogramDescriptor
    from stepscope.stats._backend import F32 as _F32
    from stepscope.stats.binning import slot_tables as _tables

    base = build_variant(tmp_path, "baseline", ["-DSTEPSCOPE_NO_CLONES"])
    assert base.stepscope_kernels_isa() == 0
    lib = _native.load()
    g = torch.Generator().manual_seed(4)
    x = torch.randn(50_000, generator=g) * torch.exp2(
        torch.randint(-30, 30, (50_000,), generator=g)
    )
    x[::101] = 0.0
    x[7::997] = float("nan")
    x[20_000:22_048] = 1.5
    desc = HistogramDescriptor()
    table, thr = _tables(desc, _F32)
    rows = []
    for k in (lib, base):
        spine = torch.zeros(SPINE_WIDTH, dtype=torch.float64)
        k.stepscope_spine_f32(x.data_ptr(), x.numel(), 1, spine.data_ptr())
        hist = torch.zeros(desc.width, dtype=torch.int64)
        args = (table.ctypes.data, thr.ctypes.data, len(thr), 2 * desc.n_bins, desc.width, 1)
        k.stepscope_hist_f32(x.data_ptr(), x.numel(), *args, hist.data_ptr())
        rows.append((spine, hist))
    (s1, h1), (s2, h2) = rows
    assert torch.equal(s1[:10], s2[:10]) and torch.equal(h1, h2)
    torch.testing.assert_close(s1, s2, rtol=1e-12, atol=0.0)
