"""DataFrames of a real run, and what ``print(series)`` shows (steps beside values, cadence).

Runs are collected from the test suite's real models (a ResNet-like CNN and a tiny GPT,
``tests/collect/models.py``); every table is checked against the reader's own arrays
(:meth:`stepscope.run.Run.series`), never against a hand-made table.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

import stepscope as ss
from stepscope.cli import main
from stepscope.collect import ALL_STREAMS, Cadence
from stepscope.stats.layout import SPINE_FIELDS
from tests.collect.models import CASES, train


@pytest.fixture(scope="module", params=["resnet", "gpt"])
def run(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "run"

    def collector(model, opt):
        settings = ss.WatchSettings(output_dir=path, durable=False)
        return ss.HistoryCollector(
            model, sites="*", streams=ALL_STREAMS, cadence=Cadence(2, 4), settings=settings
        )

    train(CASES[request.param], collector, steps=5, evaluations=False)
    return ss.open_run(path)


def test_the_tidy_table_is_the_readers_series_with_names(run):
    df = run.to_pandas()
    assert list(df.columns) == [
        "step", "optimizer_step", "examples_seen", "epoch", "micro_batch", "site", "module_type",
        "stream", "phase", "field", "value", "presence",
    ]  # fmt: skip
    assert set(df.stream) <= set(ALL_STREAMS) and set(df.field) == set(SPINE_FIELDS)
    assert {s.name for s in run.sites if s.name in set(df.site)}  # names, not ids
    some = df[df.field.isin(["total", "zero", "nan", "absmax", "mean", "m2"])]  # counts, floats
    groups = some.groupby(["site", "stream", "phase", "micro_batch", "field"], sort=False)
    checked = 0
    for (site, stream, phase, micro, field), g in groups:
        s = run.series(
            site, stream, field, phase=phase, micro_batch=None if micro < 0 else int(micro)
        )
        assert g.step.tolist() == s.steps.tolist()
        np.testing.assert_array_equal(g.value.to_numpy(), s.values)  # NaN where missing
        assert g.presence.tolist() == s.presence_names().tolist()
        checked += 1
    assert checked == len(groups) > 100
    types = {s.name: s.module_type for s in run.sites}
    assert (df.module_type == df.site.map(types)).all()
    assert (df.optimizer_step == df.step).all()
    blocks = {b.optimizer_step: b for b in run.step_blocks()}
    assert set(df.step) <= set(blocks)
    assert sorted(set(df.step)) == [0, 2, 4]  # cadence 2: the steps with rows


def test_missing_cells_are_nan_with_their_presence_never_zero(run):
    df = run.to_pandas()
    missing = df[df.presence != "observed"]
    assert missing.value.isna().all()
    assert (df[df.presence == "observed"].field == "total").any()


def test_the_wide_view_is_the_tidy_table_pivoted(run):
    tidy, wide = run.to_pandas(), run.to_pandas(wide=True)
    assert len(tidy) == len(wide) * len(SPINE_FIELDS)
    for f in SPINE_FIELDS:
        np.testing.assert_array_equal(wide[f].to_numpy(), tidy[tidy.field == f].value.to_numpy())
    keys = ["step", "site", "stream", "phase", "micro_batch", "presence"]
    first = tidy[tidy.field == SPINE_FIELDS[0]][keys].reset_index(drop=True)
    pd.testing.assert_frame_equal(first, wide[keys].reset_index(drop=True))


def test_polars_and_arrow_hold_the_same_table(run):
    want = run.to_pandas()
    for got in (run.to_polars().to_pandas(), run.to_arrow().to_pandas()):
        pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_a_missing_extra_refuses_with_the_pip_line(run, monkeypatch):
    monkeypatch.setitem(sys.modules, "polars", None)  # import polars now raises ImportError
    with pytest.raises(ss.Refusal) as err:
        run.to_polars()
    assert err.value.code == "extra_missing"
    assert "pip install 'stepscope[polars]'" in err.value.remedies


def test_export_parquet_writes_the_tidy_table(run, tmp_path):
    assert main(["export", str(run.path), "--parquet", str(tmp_path / "pq")]) == 0
    got = pd.read_parquet(tmp_path / "pq" / "observations.parquet")
    pd.testing.assert_frame_equal(got, run.to_pandas(), check_dtype=False)


def test_printing_a_series_shows_each_step_beside_its_value_and_the_cadence(run):
    df = run.to_pandas()
    site = df[(df.stream == "activation") & (df.presence == "observed")].site.iloc[0]
    s = run.series(site, "activation", "absmax")
    text = str(s)
    head, columns, *rows = text.splitlines()
    assert head == (
        f"Series {site!r} activation absmax: 3 values at steps 0..4 "
        "(activation cadence: every 2 steps; cadence=1 records every step)"
    )
    assert columns.split() == ["step", "value"]
    pairs = [(int(a), float(b)) for a, b in (r.split() for r in rows)]
    assert [p[0] for p in pairs] == s.steps.tolist()
    np.testing.assert_allclose([p[1] for p in pairs], s.values, rtol=1e-7)
    frame = s.to_pandas()
    assert frame.step.tolist() == s.steps.tolist() and (frame.presence == "observed").all()
