import time

import numpy as np
import pytest

from stepscope import Refusal, open_run
from stepscope.history import (
    HistoryWriter,
    ObservationBatch,
    ObservationRecord,
    StepBlockRecord,
    StepTruth,
)
from stepscope.history.batch import code_of
from stepscope.history.vocab import Presence
from stepscope.stats import SPINE_FIELDS, Histogram, HistogramDescriptor, RunningStats

CAPTURE_FAILED = code_of(Presence.CAPTURE_FAILED)
OBSERVED = code_of(Presence.OBSERVED)
NOT_SCHEDULED = code_of(Presence.NOT_SCHEDULED)
WIDTH = HistogramDescriptor().width


def _mixed_run(hx, path, n_steps=12, hist_every=4, commit_steps=4):
    """Activations (all observed) and gradients (site 1 unscheduled on odd steps, site 2 failed
    at step 5), histograms for sites 0 and 2 every ``hist_every`` steps, plus a loss scalar."""
    rng = np.random.default_rng(7)
    data = {}
    with HistoryWriter(path, commit_steps=commit_steps, commit_seconds=None) as w:
        ids = [w.register_site(f"l{i}", "torch.nn.Linear", f"f32[{i + 2}]") for i in range(3)]
        for step in range(n_steps):
            act = [rng.normal(size=5 + i) for i in ids]
            grad = [rng.normal(size=3) * 1e-3 for _ in ids]
            pres = np.full(3, OBSERVED, np.uint8)
            if step % 2:
                pres[1] = NOT_SCHEDULED
            if step == 5:
                pres[2] = CAPTURE_FAILED
            gsp = np.stack([hx.np_spine(g) for g in grad])
            gsp[pres != OBSERVED] = np.nan
            hist_kw = {}
            if step % hist_every == 0:
                hists = []
                for g in (grad[0], grad[2]):
                    h = Histogram()
                    h.update(__import__("torch").tensor(g))
                    hists.append(h.to_vector())
                rows = [0, 2] if pres[2] == OBSERVED else [0]
                hist_kw = dict(hist_rows=rows, histograms=np.stack(hists)[: len(rows)])
            batches = [
                ObservationBatch.observed(
                    "activation", "forward", ids, np.stack([hx.np_spine(a) for a in act])
                ),
                ObservationBatch(
                    "gradient", "backward", ids, pres, gsp, scale_grad="unscaled", **hist_kw
                ),
            ]
            block = StepBlockRecord(step, examples_seen=8 * (step + 1), truth=StepTruth(True))
            w.write_step(block, batches, scalars={"loss": 1.0 / (step + 1)})
            data[step] = (act, grad, pres, hist_kw)
    return data


def test_round_trip_values_presence_and_histograms(run_dir, hx):
    data = _mixed_run(hx, run_dir)
    h = open_run(run_dir)
    assert h.steps.tolist() == list(range(12))
    for i in range(3):
        s = h.series(f"l{i}", "activation", "sum_squares")
        expected = [
            hx.np_spine(data[t][0][i])[SPINE_FIELDS.index("sum_squares")] for t in range(12)
        ]
        np.testing.assert_array_equal(s.values, expected)  # stored bitwise
        assert s.valid.all()
    g = h.series("l1", "gradient", "mean")
    assert g.presence_names()[:2].tolist() == ["observed", "not_scheduled"]
    assert g.valid.tolist() == [t % 2 == 0 for t in range(12)]
    assert np.isnan(g.values[~g.valid]).all()  # missing is NaN with valid=False, never 0
    assert h.series("l2", "gradient", "total").presence_names()[5] == "capture_failed"
    hs = h.histograms("l0", "gradient")
    assert hs.steps.tolist() == [0, 4, 8]
    ref = Histogram()
    ref.update(__import__("torch").tensor(data[4][1][0]))
    assert hs.histogram(1) == ref
    assert h.scalars("loss").values.tolist() == [1.0 / (t + 1) for t in range(12)]
    blocks = h.step_blocks()
    assert blocks[3] == StepBlockRecord(3, examples_seen=32, truth=StepTruth(True))


def test_histogram_rows_exist_only_where_taken(run_dir, hx):
    _mixed_run(hx, run_dir, n_steps=12, hist_every=4)
    h = open_run(run_dir)
    # steps 0, 4, 8: two sites each (site 2 observed there); nothing stored elsewhere
    assert len(h.table("histograms")) == 6
    with_hist = [r for r in h.commits if any(f["table"] == "histograms" for f in r["files"])]
    assert len(with_hist) == 3  # commits are steps 0-3, 4-7, 8-11: each holds one hist step


def test_observation_records_decode_to_kernel_objects(run_dir, hx):
    data = _mixed_run(hx, run_dir, n_steps=4)
    h = open_run(run_dir)
    recs = h.observations(site="l0", stream="gradient", steps=(0, 0))
    assert len(recs) == 1
    rec = recs[0]
    assert isinstance(rec, ObservationRecord) and rec.scale_grad.value == "unscaled"
    ref = RunningStats.from_vector(hx.np_spine(data[0][1][0]))
    assert rec.spine == ref
    assert rec.histogram is not None and rec.histogram.total == 3
    missing = h.observations(site="l1", stream="gradient", steps=(1, 1))[0]
    assert missing.presence is Presence.NOT_SCHEDULED and missing.spine is None


def test_several_steps_share_a_chunk_and_commit_interval_is_a_setting(run_dir, hx):
    hx.write_simple_run(run_dir, n_steps=10, commit_steps=4)
    h = open_run(run_dir)
    assert [(r["step_lo"], r["step_hi"]) for r in h.commits] == [(0, 3), (4, 7), (8, 9)]


def test_commit_seconds_commits_without_reaching_commit_steps(tmp_path, hx):
    w = HistoryWriter(tmp_path / "r", commit_steps=10_000, commit_seconds=0.05)
    site = w.register_site("a", "t", "s")
    b = ObservationBatch.observed("activation", "forward", [site], hx.step_spines(0, 1))
    assert w.write_step(StepBlockRecord(0), [b]) is False
    time.sleep(0.06)
    assert w.write_step(StepBlockRecord(1), [b]) is True
    assert open_run(tmp_path / "r").steps.tolist() == [0, 1]
    w.close()


def test_live_reader_sees_only_committed_steps_and_refreshes(run_dir, hx):
    w = HistoryWriter(run_dir, commit_steps=2, commit_seconds=None)
    ids = [w.register_site("a", "t", "s")]
    for step in range(3):
        w.write_step(
            StepBlockRecord(step),
            [ObservationBatch.observed("activation", "forward", ids, hx.step_spines(step, 1))],
        )
    h = open_run(run_dir)
    assert h.steps.tolist() == [0, 1]  # step 2 is written but not committed
    w.write_step(StepBlockRecord(3), [])
    assert h.refresh() == 1
    assert h.steps.tolist() == [0, 1, 2, 3]
    w.close()


def test_filtered_reads_do_not_decode_unrelated_chunks(run_dir, hx):
    _mixed_run(hx, run_dir, n_steps=12, commit_steps=4)
    h = open_run(run_dir)
    grad_late = next(
        f["name"]
        for r in h.commits
        if r["step_lo"] == 8
        for f in r["files"]
        if f["table"] == "observations" and f["stream"] == "gradient"
    )
    path = run_dir / "chunks" / grad_late
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF
    path.write_bytes(bytes(raw))
    h = open_run(run_dir)
    assert h.series("l0", "activation", "mean").valid.all()  # other stream: not read
    assert len(h.series("l0", "gradient", "mean", steps=(0, 7)).steps) == 8  # other steps
    with pytest.raises(Refusal) as err:
        h.series("l0", "gradient", "mean")
    assert err.value.code == "history_artifact_corrupt" and grad_late in err.value.message


def test_resume_appends_a_segment_that_supersedes_from_its_step(run_dir, hx):
    hx.write_simple_run(run_dir, n_steps=10, commit_steps=5)
    w = HistoryWriter(run_dir, resume=True, resume_at_step=6, commit_steps=5)
    hx.write_simple_run(run_dir, n_steps=3, start=6, writer=w)  # re-registers: same structure
    h = open_run(run_dir)
    first, second = h.segments
    assert (second.parent_segment, second.resumed_at_step) == (first.segment_id, 6)
    assert h.steps.tolist() == list(range(9))  # 9 from the parent is superseded
    assert len(h.sites) == 3  # same structures keep their series
    s = h.series("s0", "activation", "total")
    assert s.steps.tolist() == list(range(9))


def test_topology_drift_ends_the_series_and_starts_a_new_one(run_dir, hx):
    with HistoryWriter(run_dir, commit_steps=1) as w:
        a = w.register_site("fc", "torch.nn.Linear", "f32[4]", label="first")
        w.write_step(
            StepBlockRecord(0),
            [ObservationBatch.observed("activation", "forward", [a], hx.step_spines(0, 1))],
        )
        assert w.register_site("fc", "torch.nn.Linear", "f32[4]", label="renamed") == a
        b = w.register_site("fc", "torch.nn.Linear", "f32[8]", step=1)
        w.write_step(
            StepBlockRecord(1),
            [ObservationBatch.observed("activation", "forward", [b], hx.step_spines(1, 1))],
        )
    h = open_run(run_dir)
    old, new = h.sites
    assert (old.ended_step, old.ended_reason, new.ended_step) == (1, "topology_drift", None)
    assert (old.signature, new.signature) == ("f32[4]", "f32[8]")
    s = h.series("fc", "activation", "total")
    assert s.site_ids.tolist() == [a, b]


def test_writer_refusals_have_codes(run_dir, hx):
    hx.write_simple_run(run_dir, n_steps=2)
    with pytest.raises(Refusal) as err:
        HistoryWriter(run_dir)
    assert err.value.code == "history_run_exists"
    w = HistoryWriter(run_dir, resume=True)
    site = w.register_site("s0", "torch.nn.Linear", "f32[7]")
    with pytest.raises(Refusal) as err:
        w.write_step(StepBlockRecord(1), [])
    assert err.value.code == "history_step_out_of_order"
    bad = ObservationBatch.observed("activation", "forward", [site + 10], hx.step_spines(2, 1))
    with pytest.raises(Refusal) as err:
        w.write_step(StepBlockRecord(2), [bad])
    assert err.value.code == "history_series_unknown"
    dup = ObservationBatch.observed("activation", "forward", [site], hx.step_spines(2, 1))
    with pytest.raises(Refusal) as err:
        w.write_step(StepBlockRecord(2), [dup, dup])
    assert err.value.code == "stat_payload_invalid"
    w.close()
    with pytest.raises(Refusal) as err:
        w.write_step(StepBlockRecord(9), [])
    assert err.value.code == "history_writer_closed"


def test_reader_refusals_for_unknown_names(run_dir, hx):
    _mixed_run(hx, run_dir, n_steps=2)
    h = open_run(run_dir)
    for call, code in [
        (lambda: h.series("nope", "activation", "mean"), "history_series_unknown"),
        (lambda: h.series("l0", "activation", "median"), "history_series_unknown"),
        (lambda: h.series("l0", "weights", "mean"), "stream_unknown"),
        (lambda: h.scalars("acc"), "history_series_unknown"),
        (lambda: open_run(run_dir / "missing"), "history_artifact_missing"),
    ]:
        with pytest.raises(Refusal) as err:
            call()
        assert err.value.code == code


def test_spine_only_observation_costs_under_200_bytes(run_dir, hx):
    hx.write_simple_run(run_dir, n_steps=40, n_sites=200, commit_steps=20)
    h = open_run(run_dir)
    sizes = h.sizes()
    rows = len(h.table("observations"))
    assert rows == 8000
    per_row = (sizes["observations"] + sizes["steps"]) / rows
    assert per_row < 200, per_row


def test_resumed_writer_reports_the_last_durable_step(run_dir, hx):
    hx.write_simple_run(run_dir, n_steps=7, commit_steps=3)
    w = HistoryWriter(run_dir, resume=True)
    assert w.committed_step == 6 and w.run.resumed_at_step == 7
    w.close()
    w = HistoryWriter(run_dir, resume=True, resume_at_step=4)
    assert w.committed_step == 3
    hx.write_simple_run(run_dir, n_steps=1, start=4, writer=w)
    h = open_run(run_dir)
    assert h.steps.tolist() == [0, 1, 2, 3, 4]  # the grandparent's 4..6 are superseded too
    assert h.series("s0", "activation", "sum").values[4] == hx.step_spines(4, 3)[0, 10]


@pytest.mark.parametrize("top", [0, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**62])
def test_histogram_counts_round_trip_exactly_at_every_width_boundary(run_dir, hx, top):
    counts = np.zeros((1, WIDTH), np.int64)
    counts[0, 3], counts[0, -1] = top, 1
    with HistoryWriter(run_dir, commit_steps=1) as w:
        site = w.register_site("a", "t", "s")
        b = ObservationBatch.observed(
            "activation", "forward", [site], hx.step_spines(0, 1), hist_rows=[0], histograms=counts
        )
        w.write_step(StepBlockRecord(0), [b])
    h = open_run(run_dir)
    got = h.histograms("a", "activation").counts
    assert got.dtype == np.int64 and np.array_equal(got, counts)
    stored = next(f for r in h.commits for f in r["files"] if f["table"] == "histograms")
    width = {255: "|u1", 256: "<u2", 65536: "<u4", 2**32: "<i8"}
    assert stored["counts_dtype"] == width.get(top, stored["counts_dtype"])


def test_a_second_live_writer_on_the_same_artifact_refuses(run_dir, hx):
    w = HistoryWriter(run_dir)
    with pytest.raises(Refusal) as err:
        HistoryWriter(run_dir, resume=True)
    assert err.value.code == "history_writer_active"
    w.close()
    again = HistoryWriter(run_dir, resume=True)  # the lock goes with close()
    again.close()


@pytest.mark.parametrize(
    "batch_wide, rows",
    [
        ((), (("b",), (), ("a", "b"), ("b",), ("c",), ("a", "b"))),  # the collector's shape
        ((), (("a", "a"), ("a",), (), ("b", "a", "b"))),  # repeats inside a row: deduplicated
        (("w",), (("a",), (), ("w", "a"), ("b",))),  # batch-wide disclosures come first
    ],
    ids=["own", "repeats", "batch_wide"],
)
def test_row_disclosures_are_interned_as_each_row_states_them(tmp_path, batch_wide, rows):
    """Each row's stored disclosure set is row_disclosure(i), interned in the order the
    per-row walk interns them (a set of the rows' full disclosures)."""
    from stepscope.stats import SPINE_WIDTH

    n = len(rows)
    with HistoryWriter(tmp_path / "r") as w:
        ids = [w.register_site(f"s{i}", "Linear", "f32[*]") for i in range(n)]
        b = ObservationBatch.observed(
            "activation",
            "forward",
            ids,
            np.zeros((n, SPINE_WIDTH)),
            disclosures=batch_wide,
            row_disclosures=rows,
        )
        expected_table = list(w.disclosures)  # the per-row walk, replayed on a copy
        if batch_wide:  # the batch-wide set is interned first
            expected_table.append(batch_wide)
        for d in set(map(b.row_disclosure, range(n))):
            if d and d not in expected_table:
                expected_table.append(d)
        obs, _ = w._encode(0, b)
        assert list(w.disclosures) == expected_table
        for i in range(n):
            full = b.row_disclosure(i)
            got = obs["disclosure"][i]
            assert (got == -1) if not full else w.disclosures[got] == full
