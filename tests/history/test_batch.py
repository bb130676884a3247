import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope import Refusal
from stepscope.history import ObservationBatch, ObservationRecord, batches_from_records
from stepscope.history.batch import code_of, member_of
from stepscope.history.vocab import Presence
from stepscope.stats import SPINE_WIDTH, Histogram, RunningStats

NAN = np.full((1, SPINE_WIDTH), np.nan)


def _spine(x):
    s = RunningStats()
    s.update(torch.tensor(x))
    return s


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"presence": [2], "spines": np.zeros((1, SPINE_WIDTH))}, "presence_payload_forbidden"),
        (
            {"presence": [2], "spines": NAN, "hist_rows": [0], "histograms": np.zeros((1, 520))},
            "presence_payload_forbidden",
        ),
        ({"presence": [9], "spines": NAN}, "stat_payload_invalid"),
        ({"presence": [1], "spines": np.zeros((1, 3))}, "stat_payload_invalid"),
        ({"presence": [1, 1], "spines": np.zeros((2, SPINE_WIDTH))}, "stat_payload_invalid"),
        ({"presence": [1], "spines": NAN}, "stat_payload_invalid"),  # NaN counts when observed
        (
            {
                "presence": [1],
                "spines": np.zeros((1, SPINE_WIDTH)),
                "hist_rows": [0],
                "histograms": -np.ones((1, 520)),
            },
            "stat_payload_invalid",
        ),
        (
            {"presence": [1], "spines": np.zeros((1, SPINE_WIDTH)), "hist_rows": [0]},
            "stat_payload_invalid",
        ),
    ],
)
def test_invalid_batches_refuse_with_codes(kwargs, code):
    site_ids = [0] if len(kwargs["presence"]) == 1 else [0, 0]
    with pytest.raises(Refusal) as err:
        ObservationBatch("activation", "forward", site_ids, **kwargs)
    assert err.value.code == code


def test_gradient_batches_need_scale_grad():
    with pytest.raises(Refusal) as err:
        ObservationBatch.observed("gradient", "backward", [0], np.zeros((1, SPINE_WIDTH)))
    assert err.value.code == "scale_grad_required"


def test_storage_codes_round_trip_and_unknown_codes_refuse():
    for p in Presence:
        assert member_of(Presence, code_of(p)) is p
    with pytest.raises(Refusal) as err:
        member_of(Presence, 0)
    assert err.value.code == "history_artifact_corrupt"


def test_records_and_batches_convert_both_ways():
    h = Histogram()
    h.update(torch.tensor([1.0, -2.0, 0.0]))
    records = [
        ObservationRecord(3, 0, "gradient", "backward", "observed", spine=_spine([1.0, 2.0]),
                          histogram=h, scale_grad="scaled", disclosures=("estimated",)),
        ObservationRecord(3, 1, "gradient", "backward", "capture_failed", scale_grad="scaled"),
        ObservationRecord(3, 2, "activation", "forward", "observed", spine=_spine([5.0])),
    ]  # fmt: skip
    batches = batches_from_records(records)
    assert sorted((b.stream.value, b.n_rows, b.n_histograms) for b in batches) == [
        ("activation", 1, 0),
        ("gradient", 1, 0),
        ("gradient", 1, 1),
    ]
    back = sorted((r for b in batches for r in b.records(3)), key=lambda r: r.site_id)
    assert back == records


def test_row_disclosures_add_to_the_batch_disclosures():
    b = ObservationBatch.observed(
        "activation",
        "forward",
        [0, 1],
        np.zeros((2, SPINE_WIDTH)),
        disclosures=("sampled",),
        row_disclosures=((), ("partial",)),
    )
    assert b.row_disclosure(0) == ("sampled",) and b.row_disclosure(1) == ("sampled", "partial")


_arrays = st.one_of(
    st.none(),
    st.integers(-5, 5),
    st.text(max_size=3),
    st.lists(st.one_of(st.integers(-(2**40), 2**40), st.floats(), st.text(max_size=2)), max_size=4),
    st.builds(lambda n, w: np.zeros((n, w)), st.integers(0, 3), st.integers(0, 20)),
)


@settings(max_examples=300, deadline=None)
@given(
    site_ids=_arrays,
    presence=_arrays,
    spines=_arrays,
    hist_rows=_arrays,
    histograms=_arrays,
    micro=st.one_of(st.none(), st.integers(-3, 40000), st.text(max_size=2)),
    rdtype=st.one_of(st.sampled_from(["float32", "float64", "int8"]), st.integers()),
    disclosures=st.one_of(st.tuples(st.text(max_size=3)), st.integers()),
)
def test_fuzzed_batch_arguments_only_ever_refuse(
    site_ids, presence, spines, hist_rows, histograms, micro, rdtype, disclosures
):
    try:
        ObservationBatch(
            "activation",
            "forward",
            site_ids,
            presence,
            spines,
            hist_rows=hist_rows,
            histograms=histograms,
            micro_batch=micro,
            reduction_dtype=rdtype,
            disclosures=disclosures,
        )
    except Refusal:
        pass


@pytest.mark.parametrize("table", ["observations", "histograms", "steps"])
def test_concat_rows_joins_structured_rows_exactly_as_numpy_does(table):
    """The commit's and the reader's join (raw bytes, no field promotion) equals
    ``np.concatenate`` bit for bit, NaN payloads and empty parts included."""
    from stepscope.history.layout import STEP_DTYPE, concat_rows, histogram_dtype, observation_dtype

    dtype = {
        "observations": observation_dtype(15),
        "histograms": histogram_dtype(8, "<u4"),
        "steps": STEP_DTYPE,
    }[table]
    rng = np.random.default_rng(0)
    parts = []
    for n in (3, 0, 5, 1):
        raw = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8)  # any bytes, NaNs too
        parts.append(raw.view(dtype))
    parts.append(np.zeros(4, dtype)[::2])  # a strided view (a masked chunk is a copy)
    joined = concat_rows(parts)
    assert joined.dtype == dtype and joined.tobytes() == np.concatenate(parts).tobytes()
    # parts of different dtypes (histogram counts of two widths) are refused, never promoted:
    # np.concatenate of exactly these two corrupts the heap under numpy 2.4 (PYTHONMALLOC=debug)
    mixed = [np.ones(2, histogram_dtype(8, "<u2")), np.ones(1, histogram_dtype(8, "<i8"))]
    with pytest.raises(ValueError, match="different dtypes"):
        concat_rows(mixed)
