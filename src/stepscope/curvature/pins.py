"""The pins a checkpoint panel verifies before any work: source files, checkpoints, probe.

A pin is the sha256 of a file's bytes (a link resolved first: a pin names content).
:func:`verify_source_file` checks a model source file before it is imported, the panel's up-front
check covers every pinned source, the file that defines the factory, every checkpoint and the
probe, and :func:`analysis_code_sha256` records the analysis code itself. A mismatch refuses
``checkpoint_tampered``; a factory outside the pinned files refuses ``curvature_source_unpinned``.
Computing the pins is :func:`stepscope.curvature.offline.make_panel_pins`; running the panel is
:func:`stepscope.curvature.offline.run_curvature_panel`.

Example
-------
>>> import hashlib, tempfile
>>> from pathlib import Path
>>> from stepscope.curvature.pins import verify_source_file
>>> source = Path(tempfile.mkdtemp()) / "model.py"
>>> _ = source.write_text("def make_model(): ...")
>>> want = hashlib.sha256(source.read_bytes()).hexdigest()
>>> verify_source_file(source, {"source_sha256": {str(source): want}}) == want
True
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from stepscope.curvature.analyze import probe_sha256
from stepscope.errors import Refusal
from stepscope.history.files import sha256_file


def _pinned_sha256(path: str | os.PathLike[str], what: str) -> str:
    """sha256 of a pinned file's bytes (:func:`stepscope.history.files.sha256_file`; a link is
    resolved first: a pin names content, not where it is linked from)."""
    return sha256_file(Path(path).resolve(), what)[0]


def factory_source(factory: Callable[..., Any]) -> Path | None:
    """The source file that defines ``factory`` (through ``functools.partial``), or ``None``."""
    while isinstance(factory, functools.partial):
        factory = factory.func
    try:
        found = inspect.getsourcefile(factory)
    except TypeError:
        return None
    return Path(found).resolve() if found else None


def verify_source_file(path: str | Path, pins: Mapping[str, Any]) -> str:
    """Check that ``path`` is a pinned source file with its pinned bytes; return its sha256.

    Call this before importing or executing the file. Refuses ``curvature_source_unpinned``
    (not named by the pins) or ``checkpoint_tampered`` (bytes differ).
    """
    target = Path(path).resolve()
    sources = {
        Path(p).resolve(): (p, want) for p, want in dict(pins.get("source_sha256") or {}).items()
    }
    if target not in sources:
        raise Refusal(
            "curvature_source_unpinned",
            f"the model factory is defined in {str(target)!r}, which the pins do not name "
            f"(pinned: {sorted(str(p) for p in sources)})",
            ["pin the file that defines the factory (make_panel_pins / curvature-pin --source)"],
        )
    name, want = sources[target]
    got = _pinned_sha256(target, "model source file") if target.is_file() else "<missing file>"
    if got != want:
        raise _tampered("model source file", name, want, got)
    return got


def analysis_code_sha256() -> dict[str, str]:
    """sha256 of each source file of :mod:`stepscope.curvature` plus ``_combined`` over them."""
    folder = Path(__file__).resolve().parent
    files = {p.name: _pinned_sha256(p, "analysis source file") for p in sorted(folder.glob("*.py"))}
    combined = hashlib.sha256("".join(f"{k}:{v}\n" for k, v in files.items()).encode())
    return {**files, "_combined": combined.hexdigest()}


def _check_recorder_probe(identity: Mapping[str, Any] | None, x: Tensor, y: Tensor) -> None:
    if identity is None:
        return
    got, count = probe_sha256(x, y), int(x.shape[0])
    if (
        identity.get("sha256") != got
        or int(identity.get("count", identity.get("size", -1))) != count
    ):
        raise _tampered(
            "probe vs the recorder's probe identity",
            "probe.json",
            f"{identity.get('sha256')} (n={identity.get('count')})",
            f"{got} (n={count})",
        )


def _tampered(what: str, path: Any, want: str, got: str) -> Refusal:
    return Refusal(
        "checkpoint_tampered",
        f"{what} {str(path)!r} has sha256 {got}, but its pin is {want}",
        ["restore the pinned file", "or re-pin deliberately and start a new output directory"],
    )


def _verify_pins(
    pins: Mapping[str, Any],
    checkpoints: Mapping[int, Path],
    x: Tensor,
    y: Tensor,
    factory: Callable[..., Any],
) -> None:
    sources = dict(pins.get("source_sha256") or {})
    if not sources:
        raise Refusal(
            "curvature_input_invalid",
            "the panel pins name no model source file",
            ["pin the files that define the model factory (make_panel_pins)"],
        )
    for path, want in sources.items():
        got = (
            _pinned_sha256(path, "model source file") if Path(path).is_file() else "<missing file>"
        )
        if got != want:
            raise _tampered("model source file", path, want, got)
    where = factory_source(factory)
    if where is None:
        raise Refusal(
            "curvature_source_unpinned",
            f"the model factory {factory!r} has no Python source file to check against the pins",
            ["pass a factory defined in a pinned .py file (a function, class or partial of one)"],
        )
    verify_source_file(where, pins)
    ckpt_pins = {int(k): v for k, v in dict(pins.get("checkpoint_sha256") or {}).items()}
    for epoch, path in checkpoints.items():
        if epoch not in ckpt_pins:
            raise Refusal(
                "curvature_input_invalid",
                f"checkpoint for epoch {epoch} has no sha256 pin",
                ["pin every checkpoint before the run"],
            )
        got = _pinned_sha256(path, "checkpoint") if path.is_file() else "<missing file>"
        if got != ckpt_pins[epoch]:
            raise _tampered("checkpoint", path, ckpt_pins[epoch], got)
    got = probe_sha256(x, y)
    if got != pins.get("probe_sha256"):
        raise _tampered("probe", "probe (x, y bytes)", str(pins.get("probe_sha256")), got)
