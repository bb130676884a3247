"""Columnar observation batches: the hot-path form of :class:`ObservationRecord`.

A collector hands the writer one :class:`ObservationBatch` per (stream, phase) per step: site ids,
presence codes and a float64 spine matrix (one row per site, NaN rows where not observed), plus
histogram rows only for the sites where a histogram was taken. Validation is vectorised.

Storage codes (``uint8``) are an enum member's 1-based declaration position; the enums are
append-only so stored codes never change meaning.

Example
-------
>>> import numpy as np
>>> from stepscope.stats import SPINE_WIDTH
>>> b = ObservationBatch.observed("activation", "forward", [0, 1], np.zeros((2, SPINE_WIDTH)))
>>> b.n_rows, b.presence.tolist()
(2, [1, 1])
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from stepscope.codec import parse_enum
from stepscope.errors import Refusal
from stepscope.history.inputs import exact_ints
from stepscope.history.schema import ObservationRecord
from stepscope.history.vocab import GRADIENT_STREAMS, Phase, Presence, ScaleGrad, Stream
from stepscope.stats import Histogram, HistogramDescriptor, RunningStats
from stepscope.stats.layout import N_COUNTS, REDUCTION_DTYPES, SPINE_WIDTH

#: id(member) -> storage code. Members are singletons; str enums compare equal across
#: vocabularies (Tristate.UNKNOWN == ScaleGrad.UNKNOWN), so codes are never keyed by value.
_CODES: dict[int, int] = {}


def code_of(member: enum.Enum) -> int:
    """The stable 1-based storage code of an enum member."""
    code = _CODES.get(id(member))
    if code is None:
        code = _CODES[id(member)] = list(type(member)).index(member) + 1
    return code


E = TypeVar("E", bound=enum.Enum)


def member_of(kind: type[E], code: int) -> E:
    """Inverse of :func:`code_of`; an unknown code refuses ``history_artifact_corrupt``."""
    members = list(kind)
    if not 1 <= int(code) <= len(members):
        raise Refusal(
            "history_artifact_corrupt",
            f"stored {kind.__name__} code {code} is outside the vocabulary.",
            ["run `stepscope verify`", "open the run with the stepscope version that wrote it"],
        )
    return members[int(code) - 1]


OBSERVED = code_of(Presence.OBSERVED)


@dataclass(frozen=True)
class ObservationBatch:
    """Observations of one (stream, phase, micro_batch) for many sites at one step.

    Parameters
    ----------
    stream, phase
        What and when (:class:`Stream`, :class:`Phase` or their string values).
    site_ids
        int array ``(n,)`` of catalog site ids, no duplicates.
    presence
        uint8 codes ``(n,)`` (see :func:`code_of` of :class:`Presence`).
    spines
        float64 ``(n, SPINE_WIDTH)``; rows whose presence is not ``observed`` must be all NaN.
    hist_rows, histograms
        Row positions (into ``site_ids``) that carry a histogram, and the int64 histogram rows
        ``(m, width)``; ``None`` when no histogram was taken this step.
    scale_grad
        Required for gradient streams.
    disclosures, row_disclosures
        Disclosures of every row, and optionally extra ones per row (e.g. partial merges).
    """

    stream: Stream
    phase: Phase
    site_ids: np.ndarray
    presence: np.ndarray
    spines: np.ndarray
    hist_rows: np.ndarray | None = None
    histograms: np.ndarray | None = None
    scale_grad: ScaleGrad | None = None
    micro_batch: int | None = None
    reduction_dtype: str = "float64"
    disclosures: tuple[str, ...] = field(default=())
    row_disclosures: tuple[tuple[str, ...], ...] | None = None

    def __post_init__(self) -> None:
        s = object.__setattr__
        s(self, "stream", parse_enum(Stream, self.stream, "stream", "stream_unknown"))
        s(self, "phase", parse_enum(Phase, self.phase, "phase", "stat_payload_invalid"))
        if self.scale_grad is not None:
            s(
                self,
                "scale_grad",
                parse_enum(ScaleGrad, self.scale_grad, "scale_grad", "stat_payload_invalid"),
            )
        if not isinstance(self.disclosures, (tuple, list)) or not all(
            isinstance(d, str) for d in self.disclosures
        ):
            raise Refusal("stat_payload_invalid", "disclosures must be a tuple of strings.")
        if self.micro_batch is not None and (
            not isinstance(self.micro_batch, (int, np.integer))
            or isinstance(self.micro_batch, bool)
        ):
            raise Refusal(
                "stat_payload_invalid", f"micro_batch {self.micro_batch!r} is not an int."
            )
        s(self, "disclosures", tuple(self.disclosures))
        if self.row_disclosures is not None:
            try:
                s(self, "row_disclosures", tuple(tuple(r) for r in self.row_disclosures))
            except TypeError:
                raise Refusal(
                    "stat_payload_invalid", "row_disclosures: tuples of strings."
                ) from None
        bad_code = "stat_payload_invalid"
        s(self, "site_ids", exact_ints(self.site_ids, np.int32, "site_ids", bad_code).reshape(-1))
        s(self, "presence", exact_ints(self.presence, np.uint8, "presence", bad_code).reshape(-1))
        if self.hist_rows is not None and self.histograms is not None:
            s(
                self,
                "hist_rows",
                exact_ints(self.hist_rows, np.int64, "hist_rows", bad_code).reshape(-1),
            )
            s(self, "histograms", exact_ints(self.histograms, np.int64, "histograms", bad_code))
        try:
            if np.asarray(self.spines).dtype.kind not in "iufb":
                raise TypeError(f"spines of dtype {np.asarray(self.spines).dtype}")
            s(self, "spines", np.ascontiguousarray(self.spines, dtype=np.float64))
        except (TypeError, ValueError, OverflowError) as exc:
            raise Refusal(
                "stat_payload_invalid",
                f"observation batch arrays are not numeric of the expected kinds ({exc}).",
                ["pass int site ids, uint8 presence codes, float64 spines, int64 histograms"],
            ) from None
        n = self.site_ids.shape[0]
        bad = []
        if self.presence.shape != (n,):
            bad.append(f"presence has shape {self.presence.shape}, expected ({n},)")
        elif n and (self.presence.min() < 1 or self.presence.max() > len(Presence)):
            bad.append("presence holds codes outside the Presence vocabulary")
        if self.spines.shape != (n, SPINE_WIDTH):
            bad.append(f"spines has shape {self.spines.shape}, expected ({n}, {SPINE_WIDTH})")
        if len(np.unique(self.site_ids)) != n:
            bad.append("site_ids repeat a site")
        if self.reduction_dtype not in REDUCTION_DTYPES:
            bad.append(f"reduction_dtype {self.reduction_dtype!r} not in {REDUCTION_DTYPES}")
        if self.row_disclosures is not None and len(self.row_disclosures) != n:
            bad.append(f"row_disclosures has {len(self.row_disclosures)} entries, expected {n}")
        if self.micro_batch is not None and not 0 <= self.micro_batch < 32767:
            bad.append(f"micro_batch {self.micro_batch} outside 0..32766")
        if (self.hist_rows is None) != (self.histograms is None):
            bad.append("hist_rows and histograms must be given together")
        elif self.hist_rows is not None:
            m = self.hist_rows.shape[0]
            if self.histograms.ndim != 2 or self.histograms.shape[0] != m:
                bad.append(f"histograms shape {self.histograms.shape} does not match {m} rows")
            elif m and (self.hist_rows.min() < 0 or self.hist_rows.max() >= n):
                bad.append("hist_rows point outside the batch")
            elif m and len(np.unique(self.hist_rows)) != m:
                bad.append("hist_rows repeat a row")
            elif m and self.histograms.min() < 0:
                bad.append("histograms hold a negative count")
        if bad:
            raise Refusal("stat_payload_invalid", "invalid observation batch: " + "; ".join(bad))
        self._check_payloads()

    def _check_payloads(self) -> None:
        observed = self.presence == OBSERVED
        if not observed.all():
            missing_rows = self.spines[~observed]
            hist_bad = self.hist_rows is not None and not observed[self.hist_rows].all()
            if hist_bad or not np.isnan(missing_rows).all():
                raise Refusal(
                    "presence_payload_forbidden",
                    f"{self.stream.value}/{self.phase.value}: a row whose presence is not "
                    "'observed' carries a spine or histogram payload.",
                    ["fill non-observed spine rows with NaN", "drop their histogram rows"],
                )
        if observed.any() and not np.isfinite(self.spines[observed, :N_COUNTS]).all():
            raise Refusal("stat_payload_invalid", "an observed spine row has a non-finite count.")
        if self.stream in GRADIENT_STREAMS and self.scale_grad is None:
            raise Refusal(
                "scale_grad_required",
                f"a {self.stream.value} batch must say whether it was loss-scaled.",
                ["pass scale_grad='scaled', 'unscaled' or 'unknown'"],
            )

    def row_disclosure(self, i: int) -> tuple[str, ...]:
        """All disclosures of row ``i`` (batch-wide first, then the row's own)."""
        if self.row_disclosures is None or not self.row_disclosures[i]:
            return self.disclosures
        return tuple(dict.fromkeys((*self.disclosures, *self.row_disclosures[i])))

    @property
    def n_rows(self) -> int:
        """Number of site rows."""
        return int(self.site_ids.shape[0])

    @property
    def n_histograms(self) -> int:
        """Number of histogram rows."""
        return 0 if self.hist_rows is None else int(self.hist_rows.shape[0])

    @classmethod
    def trusted(
        cls,
        stream: Stream,
        phase: Phase,
        site_ids: np.ndarray,
        presence: np.ndarray,
        spines: np.ndarray,
        *,
        hist_rows: np.ndarray | None = None,
        histograms: np.ndarray | None = None,
        scale_grad: ScaleGrad | None = None,
        row_disclosures: tuple[tuple[str, ...], ...] | None = None,
    ) -> ObservationBatch:
        """A batch whose caller built every array itself: taken as given, nothing checked.

        For a producer whose construction already guarantees what ``__post_init__`` checks
        (the collector's step boundary): enum members, C-contiguous ``int32`` site ids without
        repeats, ``uint8`` presence codes of the vocabulary, a ``float64`` ``(n, SPINE_WIDTH)``
        spine matrix with NaN rows wherever a row is not observed and finite counts where it
        is, ``int64`` histogram rows of observed rows only, and ``scale_grad`` on gradient
        streams. Anything built elsewhere (user input, records, merges) goes through the
        checked constructor. The arrays are not copied: the caller hands them over.

        >>> from stepscope.stats import SPINE_WIDTH
        >>> b = ObservationBatch.trusted(
        ...     Stream.ACTIVATION, Phase.FORWARD, np.array([3], np.int32),
        ...     np.array([OBSERVED], np.uint8), np.zeros((1, SPINE_WIDTH)))
        >>> b.n_rows, b.stream.value
        (1, 'activation')
        """
        batch = object.__new__(cls)
        values = {
            "stream": stream,
            "phase": phase,
            "site_ids": site_ids,
            "presence": presence,
            "spines": spines,
            "hist_rows": hist_rows,
            "histograms": histograms,
            "scale_grad": scale_grad,
            "micro_batch": None,
            "reduction_dtype": "float64",
            "disclosures": (),
            "row_disclosures": row_disclosures,
        }
        batch.__dict__.update(values)  # a frozen dataclass: no __setattr__ per field
        return batch

    @classmethod
    def observed(
        cls,
        stream: Stream | str,
        phase: Phase | str,
        site_ids: Sequence[int] | np.ndarray,
        spines: np.ndarray,
        **kwargs: Any,
    ) -> ObservationBatch:
        """A batch where every row is observed (the common hot-path case)."""
        n = len(site_ids)
        presence = np.full(n, OBSERVED, dtype=np.uint8)
        return cls(stream, phase, np.asarray(site_ids), presence, spines, **kwargs)  # type: ignore[arg-type]

    def records(
        self, step: int, descriptor: HistogramDescriptor | None = None
    ) -> list[ObservationRecord]:
        """Decode into per-observation records (spine/histogram via the stats kernels)."""
        hist_of = {}
        if self.hist_rows is not None:
            hist_of = {int(r): i for i, r in enumerate(self.hist_rows)}
        descriptor = descriptor if descriptor is not None else HistogramDescriptor()
        out = []
        for i in range(self.n_rows):
            presence = member_of(Presence, self.presence[i])
            spine = hist = None
            if presence is Presence.OBSERVED:
                spine = RunningStats.from_vector(self.spines[i], self.reduction_dtype)
                if i in hist_of:
                    hist = Histogram.from_vector(self.histograms[hist_of[i]], descriptor)  # type: ignore[index]
            out.append(
                ObservationRecord(
                    step=step,
                    site_id=int(self.site_ids[i]),
                    stream=self.stream,
                    phase=self.phase,
                    presence=presence,
                    spine=spine,
                    histogram=hist,
                    scale_grad=self.scale_grad,
                    micro_batch=self.micro_batch,
                    disclosures=self.row_disclosure(i),
                )
            )
        return out


def batches_from_records(records: Iterable[ObservationRecord]) -> list[ObservationBatch]:
    """Group per-observation records into columnar batches (one per shared attribute set)."""
    groups: dict[tuple, list[ObservationRecord]] = {}
    for r in records:
        rdtype = getattr(r.spine, "reduction_dtype", "float64") if r.spine is not None else None
        key = (r.stream, r.phase, r.micro_batch, r.scale_grad, r.disclosures, rdtype)
        groups.setdefault(key, []).append(r)
    out = []
    for (stream, phase, micro, scale, discl, rdtype), rows in groups.items():
        spines = np.full((len(rows), SPINE_WIDTH), np.nan)
        hist_rows, hists = [], []
        for i, r in enumerate(rows):
            if r.spine is not None:
                spines[i] = r.spine.to_vector()
            if r.histogram is not None:
                hist_rows.append(i)
                hists.append(r.histogram.to_vector())
        out.append(
            ObservationBatch(
                stream=stream,
                phase=phase,
                site_ids=np.array([r.site_id for r in rows]),
                presence=np.array([code_of(r.presence) for r in rows]),
                spines=spines,
                hist_rows=np.array(hist_rows, dtype=np.int64) if hists else None,
                histograms=np.stack(hists) if hists else None,
                scale_grad=scale,
                micro_batch=micro,
                reduction_dtype=rdtype or "float64",
                disclosures=discl,
            )
        )
    return out
