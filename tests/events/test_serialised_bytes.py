"""Exports of every event kind are byte-identical to the goldens captured before the event rewrite.

The goldens under ``tests/events/golden/`` were written by the code of commit 0c02377 (when
``ObserverEvent`` was one record with a kind tag); the TensorBoard and W&B goldens were
regenerated when the trackers moved to the readable tag layout (``stepscope.events.tags``:
``act/<site>/rms``, ...; ``events.jsonl`` unchanged), by running this file as a script::

    .venv/bin/python tests/events/test_serialised_bytes.py --write

The scenario goes only through public functions whose signatures did not change
(``events_from_step``, the checks, the trackers), so the same events reach the same trackers
before and after. It covers every kind: spine scalars (gradient ones with stage and scale
provenance, a sampled ``estimated`` update, a micro-batch cell), histograms with NaN/inf,
``unavailable`` (not scheduled, no finite value, empty tensor, zero parameter norm), verdicts of
four checks (one with an infinite ``observed``), a check-derived ratio and non-finite user
scalars, on three steps (one with unknown ``examples_seen``/``epoch``).

What is compared, byte for byte: the JSONL file; every call the TensorBoard tracker makes on its
writer (a recording writer: a real event file also holds wall times), on two x-axes; every row
the W&B tracker logs (a recording ``wandb`` module), on two x-axes; and ``read_jsonl`` then
``to_dict`` of every line (the JSON round trip).
"""

from __future__ import annotations

import json
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import torch

from stepscope.events import (
    EventBus,
    GradientNormCheck,
    JsonlTracker,
    NonFiniteCheck,
    TensorBoardTracker,
    UpdateRatioCheck,
    WandbTracker,
    ZeroFractionCheck,
    events_from_step,
    read_jsonl,
)
from stepscope.history import ObservationBatch, SiteRecord, StepBlockRecord
from stepscope.history.batch import code_of
from stepscope.history.vocab import Presence
from stepscope.stats import HistogramDescriptor, reduce_histograms, reduce_spines

GOLDEN = Path(__file__).with_name("golden")
NAN, INF = float("nan"), float("inf")
SITES = [
    SiteRecord(0, "fc1", "torch.nn.Linear", "f32[4]"),
    SiteRecord(1, "relu", "torch.nn.ReLU", "f32[4]"),
    SiteRecord(2, "fc2", "torch.nn.Linear", "f32[10]"),
    SiteRecord(3, "head", "torch.nn.Linear", "f32[0]"),
]
DESC = HistogramDescriptor()


def _t(values: list[float]) -> torch.Tensor:
    # dyadic values, a power-of-two finite count: every spine number is exact in any order
    return torch.tensor(values, dtype=torch.float32)


def _batch(stream, phase, tensors: dict[int, torch.Tensor | None], hist=(), **kw):
    """One batch; a ``None`` tensor is a ``not_scheduled`` row; ``hist`` = site ids with counts."""
    ids = list(tensors)
    observed = [i for i in ids if tensors[i] is not None]
    spines = np.full((len(ids), reduce_spines([_t([1.0])]).shape[1]), np.nan)
    if observed:
        spines[[ids.index(i) for i in observed]] = reduce_spines(
            [tensors[i] for i in observed]
        ).numpy()
    presence = np.array(
        [
            code_of(Presence.OBSERVED if tensors[i] is not None else Presence.NOT_SCHEDULED)
            for i in ids
        ],
        np.uint8,
    )
    if hist:
        kw["hist_rows"] = [ids.index(i) for i in hist]
        kw["histograms"] = reduce_histograms([tensors[i] for i in hist], DESC).numpy()
    return ObservationBatch(stream, phase, ids, presence, spines, **kw)


def _step(step: int) -> list[ObservationBatch]:
    fc2 = _t([INF, NAN, 2.0, -0.25, 0.0, 0.0, 8.0, 1.0, 0.5, -1.0 - step])
    act = _batch(
        "activation",
        "forward",
        {
            0: _t([0.0, 1.0, -2.0, 0.5 * (step + 1)]),
            1: None if step == 1 else _t([0.0, 0.0, 0.0, 4.0]),
            2: fc2,
            3: _t([NAN, NAN]) if step == 1 else torch.zeros(0),
        },
        hist=(0, 2),
    )
    micro = _batch(
        "gradient",
        "backward",
        {0: _t([2.0**-30, -(2.0**-30), 0.0, 0.0])},
        hist=(0,),
        scale_grad="scaled",
        micro_batch=1,
    )
    grad = _batch(
        "gradient",
        "pre_step",
        {0: _t([2048.0, 0.0, 0.0, 0.0]), 2: _t([3.0, 4.0, 0.0, 0.0, INF, 0.0, 0.0, 0.0])},
        hist=(0, 2),
        scale_grad="unscaled",
    )
    param = _batch(
        "parameter", "post_step", {0: _t([1.0, 1.0, 1.0, 1.0]), 2: _t([0.0, 0.0, 0.0, 0.0])}
    )
    upd = _batch(
        "update",
        "post_step",
        {0: _t([0.5, 0.5, 0.5, 0.5]), 2: _t([0.25, -0.25, 0.25, -0.25])},
        row_disclosures=((), ("update_sampled:4",)),
    )
    return [act, micro, grad, param, upd]


BLOCKS = [
    (StepBlockRecord(0, examples_seen=16, epoch=0), {"loss": 0.5}),
    (StepBlockRecord(1), {"loss": NAN}),
    (StepBlockRecord(2, examples_seen=48, epoch=1), {"loss": 0.25, "lr": INF}),
]


class RecordingWriter:
    """Stands in for ``SummaryWriter``: one ``repr`` line per call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def add_text(self, tag, text, step):
        self.calls.append(repr(("add_text", tag, text, step)))

    def add_scalar(self, tag, value, step):
        self.calls.append(repr(("add_scalar", tag, value, step)))

    def add_histogram_raw(self, tag, global_step=None, **kw):
        self.calls.append(repr(("add_histogram_raw", tag, global_step, sorted(kw.items()))))

    def flush(self):
        pass


class _Histogram:
    def __init__(self, np_histogram):
        self.np_histogram = np_histogram

    def __repr__(self) -> str:
        return f"Histogram(np_histogram={self.np_histogram!r})"


class RecordingRun:
    """Stands in for a W&B run: one ``repr`` line per call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def define_metric(self, *args, **kw):
        self.calls.append(repr(("define_metric", args, sorted(kw.items()))))

    def log(self, row):
        self.calls.append(repr(("log", list(row.items()))))

    def finish(self):
        self.calls.append("finish")


def produce(out: Path) -> dict[str, bytes]:
    """Run the scenario and return every serialised output (file name -> bytes)."""
    fake_wandb = types.SimpleNamespace(Histogram=_Histogram)
    writers = {a: RecordingWriter() for a in ("optimizer_step", "examples_seen")}
    runs = {a: RecordingRun() for a in ("optimizer_step", "examples_seen")}
    jsonl = out / "events.jsonl"
    bus = EventBus(capacity=10)
    for check in (
        NonFiniteCheck(),
        ZeroFractionCheck(threshold=0.5),
        GradientNormCheck(lower=1e-7, upper=1e3, streams=("gradient",)),
        UpdateRatioCheck(lower=1e-3, upper=0.1),
    ):
        bus.subscribe(check)
    bus.subscribe(JsonlTracker(jsonl))
    for axis in writers:
        bus.subscribe(TensorBoardTracker(axis=axis, writer=writers[axis]))
        bus.subscribe(WandbTracker(runs[axis], axis=axis, wandb_module=fake_wandb))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for block, scalars in BLOCKS:
            bus.publish(events_from_step(block, _step(block.optimizer_step), SITES, DESC, scalars))
        bus.close()
    files = {"events.jsonl": jsonl.read_bytes()}
    for axis in writers:
        files[f"tensorboard_{axis}.txt"] = "\n".join(writers[axis].calls).encode() + b"\n"
        files[f"wandb_{axis}.txt"] = "\n".join(runs[axis].calls).encode() + b"\n"
    return files


def test_every_export_is_byte_identical_to_the_golden(tmp_path):
    files = produce(tmp_path)
    assert sorted(files) == sorted(p.name for p in GOLDEN.iterdir())
    for name, data in files.items():
        assert data == (GOLDEN / name).read_bytes(), name


def test_golden_covers_every_kind_and_the_unknown_axis():
    lines = [json.loads(x) for x in (GOLDEN / "events.jsonl").read_text().splitlines()]
    kinds = {d["kind"] for d in lines}
    assert kinds == {"scalar", "histogram_counts", "verdict", "unavailable"}
    reasons = {d["reason"] for d in lines if d["kind"] == "unavailable"}
    assert {
        "not_scheduled",
        "undefined_no_finite_values",
        "undefined_empty_tensor",
        "undefined_zero_parameter_norm",
    } <= reasons
    checks = {d["verdict"]["check"] for d in lines if d["kind"] == "verdict"}
    assert checks == {"nonfinite", "zero_fraction", "gradient_norm", "update_ratio"}
    assert any(d["estimated"] for d in lines) and any(d["micro_batch"] == 1 for d in lines)
    assert any(d["examples_seen"] is None for d in lines)


def test_jsonl_round_trip_rewrites_the_same_bytes(tmp_path):
    produce(tmp_path)
    text = (tmp_path / "events.jsonl").read_text()
    again = "".join(
        json.dumps(e.to_dict(), separators=(",", ":"), allow_nan=False) + "\n"
        for e in read_jsonl(tmp_path / "events.jsonl")
    )
    assert again == text


if __name__ == "__main__":  # regenerate the goldens (only when the format changes on purpose)
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: test_serialised_bytes.py --write")
    GOLDEN.mkdir(exist_ok=True)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for name, data in produce(Path(d)).items():
            (GOLDEN / name).write_bytes(data)
            print(f"wrote {GOLDEN / name} ({len(data)} bytes)")
