"""The run record: one segment of a run (a fresh start or a resume) and what is needed to read it.

:class:`RunRecord` carries identity, resume ancestry, fingerprint, package versions, histogram
descriptor, cadences, budgets, device and rank/world, with a JSON round trip; :data:`FORMAT` and
:data:`SCHEMA_VERSION` name what this code writes and reads. The per-step records are in
:mod:`stepscope.history.schema`.

Example
-------
>>> from stepscope.history.runrecord import RunRecord
>>> r = RunRecord.new(run_id="demo")
>>> r.resumed(at_step=10).parent_segment == r.segment_id
True
"""

from __future__ import annotations

import platform
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy

from stepscope._version import __version__
from stepscope.errors import Refusal
from stepscope.history.fields import _finite, _mapping, _need, _opt
from stepscope.history.inputs import as_stored, check_step, check_text
from stepscope.stats import HistogramDescriptor

#: Artifact format name and the schema version this code writes and reads.
FORMAT = "stepscope.history.v1"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class RunRecord:
    """One segment of a run (a fresh start or a resume) and everything needed to read it.

    Parameters
    ----------
    run_id, segment_id
        The run and this segment's identity; a resumed segment has a new ``segment_id``.
    parent_segment, resumed_at_step
        Resume ancestry (``None`` for the first segment).
    model_fingerprint
        :func:`stepscope.history.model_fingerprint` of the model, or ``None`` if not given.
    histogram_descriptor
        ``HistogramDescriptor.to_dict()`` of every histogram in the run.
    extra
        JSON-safe extension room (e.g. overhead ``measurements`` recorded by later layers).

    Example
    -------
    >>> r = RunRecord.new(run_id="demo")
    >>> RunRecord.from_dict(r.to_dict()) == r
    True
    """

    run_id: str
    segment_id: str
    schema_version: int = SCHEMA_VERSION
    parent_segment: str | None = None
    resumed_at_step: int | None = None
    model_fingerprint: str | None = None
    packages: Mapping[str, str] = field(default_factory=dict)
    histogram_descriptor: Mapping[str, Any] = field(default_factory=dict)
    cadences: Mapping[str, int] = field(default_factory=dict)
    budgets: Mapping[str, float] = field(default_factory=dict)
    device: str = "cpu"
    rank: int = 0
    world_size: int = 1
    created_unix: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("run_id", "segment_id"):  # printed, used in tags and file names: printable
            value = check_text(getattr(self, name), name, limit=200)
            if not value.isprintable():
                raise Refusal(
                    "history_write_invalid",
                    f"{name} {value!r} holds control characters (terminal escapes, newlines).",
                    [f"pass {name}= printable text, e.g. 'resnet-lr3e-4'"],
                )
        if self.resumed_at_step is not None:
            check_step(self.resumed_at_step, "resumed_at_step")
        for name, low in (("rank", 0), ("world_size", 1)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not low <= v < 2**31:
                raise Refusal("history_write_invalid", f"{name} {v!r} is not an int >= {low}.")

    @classmethod
    def new(cls, run_id: str | None = None, **fields: Any) -> RunRecord:
        """A first segment with fresh ids, current package versions and creation time."""
        fields.setdefault("packages", package_versions())
        fields.setdefault("created_unix", time.time())
        if "histogram_descriptor" not in fields:
            fields["histogram_descriptor"] = _default_descriptor()
        return cls(run_id=run_id or uuid.uuid4().hex[:12], segment_id=_new_segment_id(), **fields)

    def resumed(self, at_step: int) -> RunRecord:
        """The record of a new segment that resumes this one at ``at_step``."""
        d = self.to_dict()
        d.update(
            segment_id=_new_segment_id(),
            parent_segment=self.segment_id,
            resumed_at_step=int(at_step),
            packages=package_versions(),
            created_unix=time.time(),
        )
        return RunRecord.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dictionary."""
        return {
            "schema_version": self.schema_version,
            "run_id": self.run_id,
            "segment_id": self.segment_id,
            "parent_segment": self.parent_segment,
            "resumed_at_step": self.resumed_at_step,
            "model_fingerprint": self.model_fingerprint,
            "packages": dict(self.packages),
            "histogram_descriptor": dict(self.histogram_descriptor),
            "cadences": dict(self.cadences),
            "budgets": dict(self.budgets),
            "device": self.device,
            "rank": self.rank,
            "world_size": self.world_size,
            "created_unix": self.created_unix,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunRecord:
        """Inverse of :meth:`to_dict`; malformed input refuses ``history_json_invalid``."""
        w = "run record"
        version = _need(d, "schema_version", int, w)
        if version != SCHEMA_VERSION:
            raise Refusal(
                "history_schema_unsupported",
                f"run record has schema version {version}; this stepscope reads {SCHEMA_VERSION}.",
                ["open it with the stepscope version that wrote it"],
            )
        return as_stored(
            cls,
            schema_version=version,
            run_id=_need(d, "run_id", str, w),
            segment_id=_need(d, "segment_id", str, w),
            parent_segment=_opt(d, "parent_segment", str, w),
            resumed_at_step=_opt(d, "resumed_at_step", int, w),
            model_fingerprint=_opt(d, "model_fingerprint", str, w),
            packages=_mapping(d, "packages", w),
            histogram_descriptor=_mapping(d, "histogram_descriptor", w),
            cadences=_mapping(d, "cadences", w),
            budgets=_mapping(d, "budgets", w),
            device=_need(d, "device", str, w),
            rank=_need(d, "rank", int, w),
            world_size=_need(d, "world_size", int, w),
            created_unix=_finite(_need(d, "created_unix", (int, float), w), "created_unix", w),
            extra=_mapping(d, "extra", w),
        )


def package_versions() -> dict[str, str]:
    """Versions of python, torch, numpy and stepscope in this process."""
    import torch  # lazy: history imports no torch; only its version is read here

    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "numpy": numpy.__version__,
        "stepscope": __version__,
    }


def _new_segment_id() -> str:
    return uuid.uuid4().hex[:16]


def _default_descriptor() -> dict[str, Any]:
    return HistogramDescriptor().to_dict()
