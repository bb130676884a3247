"""On-disk layout of ``stepscope.history.v1``: table dtypes, chunk encoding, the catalog.

Tables (one ``.npy`` structured array per table per stream per commit):

``steps``
    one row per step block (``-1`` / NaN encode ``None``: examples_seen, epoch, micro_batches,
    scale, wall_time can never legitimately be negative or NaN).
``observations``
    one row per (step, site, stream, phase, micro_batch): storage codes plus the float64 spine.
``histograms``
    only rows where a histogram was taken: the key plus the int64 histogram row.
``scalars``
    generic per-step user scalars ``(step, name id, value)``; names live in the catalog.

New row kinds are added as new table names; a reader skips tables it does not know (listing them
in :attr:`HistoryReader.unknown_tables`), so old readers keep working on newer artifacts.
"""

from __future__ import annotations

import functools
import io
import re
from typing import Any

import numpy as np

from stepscope.errors import Refusal
from stepscope.history.batch import ObservationBatch, code_of, member_of
from stepscope.history.inputs import as_stored
from stepscope.history.runrecord import FORMAT
from stepscope.history.schema import SiteRecord, StepBlockRecord, StepTruth
from stepscope.history.vocab import StepProvenance, Tristate
from stepscope.stats.layout import REDUCTION_DTYPES

TABLES = ("steps", "observations", "histograms", "scalars")
STEP_DTYPE = np.dtype(
    [
        ("step", "<i8"),
        ("examples_seen", "<i8"),
        ("epoch", "<i8"),
        ("provenance", "u1"),
        ("applied", "u1"),
        ("unscaled", "u1"),
        ("clipped", "u1"),
        ("micro_batches", "<i4"),
        ("scale", "<f8"),
        ("wall_time", "<f8"),
    ]
)
SCALAR_DTYPE = np.dtype([("step", "<i8"), ("name", "<i4"), ("value", "<f8")])
_KEY = [
    ("step", "<i8"),
    ("site", "<i4"),
    ("micro_batch", "<i2"),
    ("stream", "u1"),
    ("phase", "u1"),
]


def observation_dtype(spine_width: int) -> np.dtype:
    """Row dtype of the observations table (142 bytes with a 15-wide spine)."""
    return np.dtype(
        [
            *_KEY,
            ("presence", "u1"),
            ("scale_grad", "u1"),  # 0: not a gradient stream
            ("rdtype", "u1"),  # index into REDUCTION_DTYPES
            ("disclosure", "<i4"),  # index into catalog["disclosures"], -1: none
            ("spine", "<f8", (spine_width,)),
        ]
    )


#: Count dtypes a histogram chunk may use; the writer picks the narrowest that holds its largest
#: count (exact), the reader widens to int64.
COUNT_DTYPES = ("|u1", "<u2", "<u4", "<i8")


def histogram_dtype(width: int, counts: str = "<i8") -> np.dtype:
    """Row dtype of the histograms table (``counts`` one of :data:`COUNT_DTYPES`)."""
    return np.dtype([*_KEY, ("counts", counts, (width,))])


def narrow_histograms(rows: np.ndarray) -> tuple[np.ndarray, str]:
    """The same rows with the narrowest exact count dtype, and that dtype's string."""
    top = int(rows["counts"].max()) if len(rows) else 0
    for code in COUNT_DTYPES[:-1]:
        if top <= np.iinfo(np.dtype(code)).max:
            out = np.empty(len(rows), histogram_dtype(rows.dtype["counts"].shape[0], code))
            for name in rows.dtype.names or ():
                out[name] = rows[name]
            return out, code
    return rows, COUNT_DTYPES[-1]


def encode_steps(blocks: list[StepBlockRecord]) -> np.ndarray:
    """Step blocks as a ``STEP_DTYPE`` array."""
    out = np.empty(len(blocks), STEP_DTYPE)
    for i, b in enumerate(blocks):
        t = b.truth
        out[i] = (
            b.optimizer_step,
            -1 if b.examples_seen is None else b.examples_seen,
            -1 if b.epoch is None else b.epoch,
            code_of(b.provenance),
            code_of(t.applied),
            code_of(t.unscaled),
            code_of(t.clipped),
            -1 if t.micro_batches is None else t.micro_batches,
            np.nan if t.scale is None else t.scale,
            np.nan if b.wall_time is None else b.wall_time,
        )
    return out


def concat_rows(parts: list[np.ndarray]) -> np.ndarray:
    """Structured arrays of one dtype joined, as their bytes are (``np.concatenate`` of
    structured arrays promotes their fields pair by pair: ~30x slower for a commit's parts).

    Every part must have the dtype of the first (a table's chunks do; the reader widens a
    narrowed histogram chunk first): parts of different dtypes are refused, never promoted.

    >>> a, b = np.zeros(2, STEP_DTYPE), np.ones(1, STEP_DTYPE)
    >>> concat_rows([a, b]).tobytes() == np.concatenate([a, b]).tobytes()
    True
    """
    dtype = parts[0].dtype
    if any(p.dtype != dtype for p in parts):
        raise ValueError(f"concat_rows: parts of different dtypes ({dtype} and others)")
    raw = np.concatenate([np.ascontiguousarray(p).view((np.void, dtype.itemsize)) for p in parts])
    return raw.view(dtype).reshape(-1)


def decode_steps(rows: np.ndarray) -> list[StepBlockRecord]:
    """Inverse of :func:`encode_steps`."""

    def opt(v: Any) -> int | None:
        return None if v < 0 else int(v)

    def optf(v: Any) -> float | None:
        return None if np.isnan(v) else float(v)

    return [
        as_stored(
            StepBlockRecord,
            optimizer_step=int(r["step"]),
            examples_seen=opt(r["examples_seen"]),
            epoch=opt(r["epoch"]),
            provenance=member_of(StepProvenance, r["provenance"]),
            truth=StepTruth(
                applied=member_of(Tristate, r["applied"]),
                scale=optf(r["scale"]),
                unscaled=member_of(Tristate, r["unscaled"]),
                clipped=member_of(Tristate, r["clipped"]),
                micro_batches=opt(r["micro_batches"]),
            ),
            wall_time=optf(r["wall_time"]),
        )
        for r in rows
    ]


def encode_batch(
    step: int,
    batch: ObservationBatch,
    disclosure_id: int,
    obs_dtype: np.dtype,
    hist_dtype: np.dtype,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Vectorised: one batch to observation rows and (if any) histogram rows."""
    n = batch.n_rows
    obs = np.empty(n, obs_dtype)
    micro = -1 if batch.micro_batch is None else batch.micro_batch
    obs["step"] = step
    obs["site"] = batch.site_ids
    obs["micro_batch"] = micro
    obs["stream"] = code_of(batch.stream)
    obs["phase"] = code_of(batch.phase)
    obs["presence"] = batch.presence
    obs["scale_grad"] = 0 if batch.scale_grad is None else code_of(batch.scale_grad)
    obs["rdtype"] = REDUCTION_DTYPES.index(batch.reduction_dtype)
    obs["disclosure"] = disclosure_id
    obs["spine"] = batch.spines
    if batch.hist_rows is None or batch.n_histograms == 0:
        return obs, None
    check_histogram_width(batch, hist_dtype)
    hist = np.empty(batch.n_histograms, hist_dtype)
    for name, _ in _KEY:
        hist[name] = obs[name][batch.hist_rows]
    hist["counts"] = batch.histograms
    return obs, hist


def check_histogram_width(batch: ObservationBatch, hist_dtype: np.dtype) -> None:
    """Refuse ``sketch_descriptor_mismatch`` for histogram rows of another width than the run's.

    >>> import numpy as np
    >>> b = ObservationBatch.observed("activation", "forward", [0], np.zeros((1, 15)),
    ...     hist_rows=[0], histograms=np.zeros((1, 8), np.int64))
    >>> check_histogram_width(b, histogram_dtype(8))  # the run's width: nothing to say
    >>> check_histogram_width(b, histogram_dtype(16))
    Traceback (most recent call last):
    ...
    stepscope.errors.RefusalInputError: [sketch_descriptor_mismatch] histogram rows have width 8, ...
    """
    if batch.histograms is None or batch.n_histograms == 0:
        return
    if batch.histograms.shape[1] != hist_dtype["counts"].shape[0]:
        raise Refusal(
            "sketch_descriptor_mismatch",
            f"histogram rows have width {batch.histograms.shape[1]}, the run's descriptor "
            f"has width {hist_dtype['counts'].shape[0]}.",
            ["reduce with the run's HistogramDescriptor (writer.descriptor)"],
        )


def npy_bytes(array: np.ndarray) -> bytes:
    """Serialise one array as ``.npy`` (no pickle)."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def npy_load(data: bytes, name: str, expected: np.dtype | None) -> np.ndarray:
    """Parse ``.npy`` bytes without pickle; anything malformed refuses ``history_artifact_corrupt``.

    Fast path: a 1-D chunk whose header is exactly what this writer emits for ``expected`` is
    viewed in place (no header ``literal_eval``, no copy). Anything else goes through numpy's
    header parser and must still be a 1-D array of ``expected`` whose declared row count matches
    the bytes present: nothing is allocated from a header's claim.
    """
    if expected is not None:
        fast = _fast_view(data, expected)
        if fast is not None:
            return fast
    fmt = np.lib.format
    buf = io.BytesIO(data)
    try:
        version = fmt.read_magic(buf)
        read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"unsupported .npy version {version}")
        shape, _fortran, dtype = read_header(buf)
    except Exception as exc:  # numpy raises ValueError, SyntaxError, TokenError, ... on junk
        raise Refusal(
            "history_artifact_corrupt",
            f"chunk {name} is not a readable .npy file ({type(exc).__name__}: {str(exc)[:120]}).",
            ["restore the chunk from a copy", "run `stepscope verify` to list all damage"],
        ) from None
    if expected is not None and dtype != expected:
        raise Refusal(
            "history_artifact_corrupt",
            f"chunk {name} has dtype {dtype}, expected {expected}.",
            ["restore the chunk from a copy"],
        )
    body = len(data) - buf.tell()
    if len(shape) != 1 or dtype.hasobject or shape[0] * dtype.itemsize != body:
        raise Refusal(
            "history_artifact_corrupt",
            f"chunk {name} declares shape {shape} of {dtype.itemsize}-byte rows but holds "
            f"{body} data bytes (chunks are 1-D).",
            ["restore the chunk from a copy"],
        )
    return np.frombuffer(data, dtype=dtype, count=shape[0], offset=buf.tell())


_SHAPE = re.compile(rb"'shape': \((\d+),\), \}\s*\n$")


@functools.lru_cache(maxsize=32)
def _header_prefix(dtype: np.dtype) -> bytes:
    head = npy_bytes(np.empty(0, dtype))
    hlen = int.from_bytes(head[8:10], "little")
    text = head[10 : 10 + hlen]
    return text[: text.index(b"'shape'")]


def _fast_view(data: bytes, dtype: np.dtype) -> np.ndarray | None:
    if data[:8] != b"\x93NUMPY\x01\x00" or len(data) < 10:
        return None
    hlen = int.from_bytes(data[8:10], "little")
    header = data[10 : 10 + hlen]
    prefix = _header_prefix(dtype)
    match = _SHAPE.search(header)
    if not header.startswith(prefix) or match is None or match.start() != len(prefix):
        return None
    n = int(match.group(1))
    if len(data) != 10 + hlen + n * dtype.itemsize:
        return None
    return np.frombuffer(data, dtype=dtype, count=n, offset=10 + hlen)


def catalog_dict(
    sites: list[SiteRecord], scalar_names: list[str], disclosures: list[tuple[str, ...]]
) -> dict[str, Any]:
    """The ``catalog.json`` content."""
    return {
        "format": FORMAT,
        "sites": [s.to_dict() for s in sites],
        "scalar_names": list(scalar_names),
        "disclosures": [list(d) for d in disclosures],
        "tables": {
            "steps": {"dtype": _descr(STEP_DTYPE), "rows": "one per step block"},
            "observations": {"rows": "one per (step, site, stream, phase, micro_batch)"},
            "histograms": {"rows": "only where a histogram was taken"},
            "scalars": {"dtype": _descr(SCALAR_DTYPE), "rows": "(step, name id, value)"},
        },
        "reduction_dtypes": list(REDUCTION_DTYPES),
    }


def parse_catalog(d: dict[str, Any]) -> tuple[list[SiteRecord], list[str], list[tuple[str, ...]]]:
    """Sites, scalar names and disclosure sets from ``catalog.json`` (validated)."""
    sites_raw, names, discl = d.get("sites"), d.get("scalar_names", []), d.get("disclosures", [])
    if (
        not isinstance(sites_raw, list)
        or not isinstance(names, list)
        or not isinstance(discl, list)
        or not all(isinstance(n, str) for n in names)
        or not all(isinstance(x, list) and all(isinstance(s, str) for s in x) for x in discl)
    ):
        raise Refusal("history_json_invalid", "catalog.json lacks sites/scalar_names/disclosures.")
    sites = [SiteRecord.from_dict(s) for s in sites_raw]
    if [s.site_id for s in sites] != list(range(len(sites))):
        raise Refusal("history_json_invalid", "catalog.json site ids are not 0..n-1 in order.")
    return sites, names, [tuple(x) for x in discl]


def _descr(dtype: np.dtype) -> list[list[str]]:
    return [[name, dtype[name].str] for name in dtype.names or ()]
