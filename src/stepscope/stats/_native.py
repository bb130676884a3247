"""Load the fused C kernels (``_kernels.c``), compiled into the package at install time, via ctypes.

Where the library comes from (``STEPSCOPE_KERNEL``):

- ``auto`` (default) and ``c``: the shared library the install built
  (``stepscope/stats/_stepscope_kernels*.so``, see ``setup.py``). Nothing is compiled at run time.
  When it is missing or stale, ``auto`` warns once and uses the pure-torch path (identical
  results, slower); ``c`` raises.
- ``jit``: explicit opt-in to compile ``_kernels.c`` with the system C compiler into a cache
  (``$STEPSCOPE_CACHE`` or ``~/.cache/stepscope``), with the same portable flags as the install.
  ``STEPSCOPE_NATIVE_ARCH=1`` adds ``-march=native``; the cache key then includes the machine's
  CPU model and flags, so a home directory shared across CPU types never loads a foreign build.
- ``torch``: always the pure-torch path.

``STEPSCOPE_KERNEL_ISA=baseline|v3|v4`` builds (as ``jit`` does, into the cache) a library of one
x86-64 level only, with no run-time dispatch: baseline x86-64, x86-64-v3 (AVX2 + FMA) or
x86-64-v4 (AVX-512 + FMA). It exists so that one machine can run the suite on every clone the
packaged library may pick elsewhere (CI does); a level this CPU lacks raises instead of crashing.

:func:`backend_info` says which path runs and where the library came from; the collector writes it
into the run record.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

_SOURCE = Path(__file__).with_name("_kernels.c")
_EXTENSION = "stepscope.stats._stepscope_kernels"
#: The ABI the Python side expects (``stepscope_kernels_version()`` in ``_kernels.c``).
KERNELS_VERSION = 8
_LOCK = threading.Lock()
_STATE: dict[str, object] = {}

#: Portable flags, the same as ``setup.py`` (no ``-march=native`` unless explicitly asked for).
_FLAGS = [
    "-O3",
    "-fPIC",
    "-shared",
    "-std=c11",
    "-fno-math-errno",
    "-fopenmp-simd",
    "-pthread",
    "-Wl,--no-undefined",
]
_ISA = {
    0: "portable",
    1: "baseline (x86-64)",
    2: "avx2",
    3: "avx512f",
    4: "x86-64-v3 (avx2, fma)",
    5: "x86-64-v4 (avx512, fma)",
}


def _cache_dir() -> Path:
    root = os.environ.get("STEPSCOPE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "stepscope"
    )
    return Path(root) / "kernels"


def _cpu_fingerprint() -> str:
    """CPU model and feature flags: part of the JIT cache key when building for this CPU only."""
    text = platform.machine() + platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features")):
                    text += line
                if line.strip() == "":
                    break  # the first processor describes them all
    except OSError:
        pass
    return text


#: ``STEPSCOPE_KERNEL_ISA`` levels: (``-march`` value, the ``stepscope_kernels_isa()`` code).
LEVELS: dict[str, tuple[str, int]] = {
    "baseline": ("x86-64", 1),
    "v3": ("x86-64-v3", 4),
    "v4": ("x86-64-v4", 5),
}


def _forced_level() -> tuple[str, int] | None:
    name = os.environ.get("STEPSCOPE_KERNEL_ISA", "")
    if not name:
        return None
    if name not in LEVELS or platform.machine() not in ("x86_64", "AMD64"):
        raise RuntimeError(
            f"STEPSCOPE_KERNEL_ISA={name!r}: use one of {sorted(LEVELS)} on x86-64 (or unset it)"
        )
    return LEVELS[name]


def _cpu_level() -> int:
    """The highest level this CPU runs, as the packaged (dispatching) library detects it."""
    return int(ctypes.CDLL(str(_packaged_library())).stepscope_kernels_isa())


def _jit_flags() -> list[str]:
    flags = list(_FLAGS)
    forced = _forced_level()
    if forced is not None:
        march, code = forced
        if _cpu_level() < code:
            raise RuntimeError(f"STEPSCOPE_KERNEL_ISA: this CPU cannot run -march={march}")
        flags += ["-DSTEPSCOPE_NO_CLONES", f"-march={march}", f"-DSTEPSCOPE_FORCED_ISA={code}"]
    elif os.environ.get("STEPSCOPE_NATIVE_ARCH") == "1":
        flags.append("-march=native")
    return flags


def _compile(target: Path, flags: list[str]) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("no C compiler found (set CC, or install gcc)")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
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


def _jit_library() -> Path:
    flags = _jit_flags()
    key = _SOURCE.read_bytes() + " ".join(flags).encode() + platform.machine().encode()
    if "-march=native" in flags:
        key += _cpu_fingerprint().encode()
    target = _cache_dir() / f"stepscope_kernels_{hashlib.sha256(key).hexdigest()[:16]}.so"
    if not target.exists():
        _compile(target, flags)
    return target


def _packaged_library() -> Path:
    try:
        spec = importlib.util.find_spec(_EXTENSION)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or not os.path.exists(spec.origin):
        raise RuntimeError(
            "the compiled kernel is not installed (the install found no C compiler, or this "
            "checkout was not re-installed after _kernels.c changed): reinstall stepscope "
            "(pip install -e . in a checkout), or opt in to STEPSCOPE_KERNEL=jit"
        )
    return Path(spec.origin)


_P, _I64, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
#: Every function ``_kernels.c`` exports, with its ctypes signature (argument types, result type):
#: :func:`_bind` binds exactly these, and a test checks the library's dynamic symbol table
#: against this table, so an export is never left unbound.
EXPORTS: dict[str, tuple[list[Any], Any]] = {
    "stepscope_kernels_version": ([], _I32),
    "stepscope_kernels_isa": ([], _I32),
    "stepscope_spine_f32": ([_P, _I64, _I32, _P], None),
    "stepscope_spine_f64": ([_P, _I64, _I32, _P], None),
    "stepscope_spine_many": ([_I64, _P, _P, _P, _I32, _P], None),
    "stepscope_spine_merge": ([_P, _P], None),
    "stepscope_gather_many": ([_I64, _P, _P, _P, _P, _P, _I32], None),
    "stepscope_hist_f32": ([_P, _I64, _P, _P, _I32, _I64, _I64, _I32, _P], None),
    "stepscope_hist_f64": ([_P, _I64, _P, _P, _I32, _I64, _I64, _I32, _P], None),
    "stepscope_spine_hist_f32": ([_P, _I64, _P, _P, _I32, _I64, _I64, _I32, _P, _P], None),
    "stepscope_spine_hist_many": (
        [_I64, _P, _P, _P, _I32, _P, _P, _P, _P, _P, _I64, _I64],
        None,
    ),
}


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.stepscope_kernels_version.restype = _I32  # first: an old library may lack the others
    version = lib.stepscope_kernels_version()
    if version != KERNELS_VERSION:
        raise RuntimeError(
            f"stale compiled kernel (version {version}, need {KERNELS_VERSION}): reinstall stepscope"
        )
    for name, (argtypes, restype) in EXPORTS.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = restype
    return lib


def load() -> ctypes.CDLL | None:
    """The loaded kernel library; ``None`` if unavailable or disabled (see the module docstring)."""
    with _LOCK:
        if "lib" in _STATE:
            return _STATE["lib"]  # type: ignore[return-value]
        lib = None
        mode = os.environ.get("STEPSCOPE_KERNEL", "auto")
        if mode != "torch" and os.environ.get("STEPSCOPE_KERNEL_ISA"):
            mode = "jit"  # one forced level is always a build of its own
        _STATE["source"] = "none"
        if mode == "torch":
            _STATE["reason"] = "disabled by STEPSCOPE_KERNEL=torch"
        else:
            try:
                path = _jit_library() if mode == "jit" else _packaged_library()
                lib = _bind(ctypes.CDLL(str(path)))
                _STATE["source"] = "jit" if mode == "jit" else "packaged"
                _STATE["path"] = str(path)
                _STATE["isa"] = _ISA.get(lib.stepscope_kernels_isa(), "unknown")
                _STATE["reason"] = f"{_STATE['source']} C kernel {path.name}"
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                lib = None
                _STATE["reason"] = f"C kernel unavailable: {exc}"
                if mode in ("c", "jit"):
                    raise
                warnings.warn(
                    f"stepscope: {_STATE['reason']}; using the slower pure-torch kernels",
                    RuntimeWarning,
                    stacklevel=3,
                )
        _STATE["lib"] = lib
        return lib


def loaded() -> ctypes.CDLL | None:
    """:func:`load` without taking the lock once the library is loaded (the per-tensor hot path)."""
    lib = _STATE.get("lib", _STATE)
    return load() if lib is _STATE else lib  # type: ignore[return-value]


def backend_info() -> dict[str, str]:
    """Which CPU kernel path runs and where it came from.

    Returns
    -------
    dict
        ``cpu``: ``"c"`` or ``"torch"``; ``source``: ``"packaged"`` (built at install time),
        ``"jit"`` (explicit opt-in) or ``"none"``; ``isa``: the instruction set the dispatched
        loops use (``"x86-64-v4 (avx512, fma)"``, ``"x86-64-v3 (avx2, fma)"``, ``"baseline (x86-64)"``,
        ``"portable"``; ``"avx512f"``/``"avx2"`` from compilers before GCC 12; empty without the C
        kernel); ``detail``: why.

    Examples
    --------
    >>> from stepscope.stats import backend_info
    >>> sorted(backend_info())
    ['cpu', 'detail', 'isa', 'source']
    """
    lib = load()
    return {
        "cpu": "c" if lib is not None else "torch",
        "source": str(_STATE.get("source", "none")),
        "isa": str(_STATE.get("isa", "")) if lib is not None else "",
        "detail": str(_STATE.get("reason", "")),
    }
