"""Build and load the fused C kernels (``_kernels.c``) with the system C compiler, via ctypes.

The shared library is compiled once per source hash into a cache directory
(``$STEPSCOPE_CACHE`` or ``~/.cache/stepscope``) and reused by later processes. When no compiler
is available, or ``STEPSCOPE_KERNEL=torch`` is set, :func:`load` returns ``None`` and callers use
the pure-torch path, which gives identical results (tests check both). :func:`backend_info` says
which path runs.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

_SOURCE = Path(__file__).with_name("_kernels.c")
_LOCK = threading.Lock()
_STATE: dict[str, object] = {}

_FLAGS = [
    "-O3",
    "-fPIC",
    "-shared",
    "-fopenmp",
    "-std=c11",
    "-fno-math-errno",
    "-Wl,--no-undefined",
]


def _cache_dir() -> Path:
    root = os.environ.get("STEPSCOPE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "stepscope"
    )
    return Path(root) / "kernels"


def _compile(target: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler found (set CC, or install gcc)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    flags = list(_FLAGS)
    if os.environ.get("STEPSCOPE_NATIVE_ARCH", "1") == "1":
        flags.append("-march=native")
    try:
        subprocess.run(
            [cc, *flags, str(_SOURCE), "-o", tmp, "-lm"],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        os.replace(tmp, target)  # atomic: concurrent builders race harmlessly
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"C kernel build failed: {exc.stderr.strip()[:500]}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    for name in ("stepscope_spine_f32", "stepscope_spine_f64"):
        fn = getattr(lib, name)
        fn.argtypes = [p, i64, i32, p]
        fn.restype = None
    for name in ("stepscope_hist_f32", "stepscope_hist_f64"):
        fn = getattr(lib, name)
        fn.argtypes = [p, i64, p, p, i32, i64, i64, i32, p]
        fn.restype = None
    return lib


def load() -> ctypes.CDLL | None:
    """The loaded kernel library, building it if needed; ``None`` if unavailable or disabled."""
    with _LOCK:
        if "lib" in _STATE:
            return _STATE["lib"]  # type: ignore[return-value]
        lib = None
        if os.environ.get("STEPSCOPE_KERNEL", "auto") == "torch":
            _STATE["reason"] = "disabled by STEPSCOPE_KERNEL=torch"
        else:
            source = _SOURCE.read_bytes()
            arch = os.environ.get("STEPSCOPE_NATIVE_ARCH", "1")
            tag = hashlib.sha256(source + " ".join(_FLAGS).encode() + arch.encode()).hexdigest()[
                :16
            ]
            target = _cache_dir() / f"stepscope_kernels_{tag}.so"
            try:
                if not target.exists():
                    _compile(target)
                lib = _bind(ctypes.CDLL(str(target)))
                _STATE["reason"] = f"compiled C kernel {target}"
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                _STATE["reason"] = f"C kernel unavailable: {exc}"
                if os.environ.get("STEPSCOPE_KERNEL") == "c":
                    raise
                warnings.warn(
                    f"stepscope: {_STATE['reason']}; using the slower pure-torch kernels",
                    RuntimeWarning,
                    stacklevel=3,
                )
        _STATE["lib"] = lib
        return lib


def backend_info() -> dict[str, str]:
    """Which CPU kernel path runs (``"c"`` or ``"torch"``) and why."""
    lib = load()
    return {"cpu": "c" if lib is not None else "torch", "detail": str(_STATE.get("reason", ""))}
