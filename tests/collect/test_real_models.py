"""The real-model matrix: every recorded row equals an independent oracle's numbers.

For each model of :mod:`models` (built in the test, no downloads), over 6 steps and every stream:
every selected site has a record at every scheduled step; observed rows equal the numbers the
oracle's own hooks and snapshots give (numel, sum, sum of squares, min, max) over *training*
forwards only (evaluations under ``no_grad``/``inference_mode`` in either module mode, and
checkpoint recomputes, are excluded); rows the oracle could not see are ``site_absent`` or
``unsupported`` with a reason; site counts stay constant across sequence lengths; and training
is bitwise the same as an unobserved control.
"""

import pytest
import torch

from stepscope.collect import ALL_STREAMS, Cadence, HistoryCollector, WatchSettings
from stepscope.history import Presence
from stepscope.history.batch import member_of
from tests.collect.models import CASES, close, spine_numbers, train

STEPS = 6


def everything(name, module):
    return True  # every module, containers and the model itself included


def recorded(c):
    """``{(site, stream, step): (presence, spine row, row disclosures)}`` from the ring."""
    out = {}
    for rb in c.ring.blocks():
        step = rb.block.optimizer_step
        for b in rb.batches:
            for j, sid in enumerate(b.site_ids):
                notes = b.row_disclosures[j] if b.row_disclosures else ()
                key = (c.sites[int(sid)].name, b.stream.value, step)
                assert key not in out, f"two records for {key}"
                out[key] = (member_of(Presence, b.presence[j]), b.spines[j], notes)
    return out


def collector_factory(model, opt):
    return HistoryCollector(
        model,
        sites=everything,
        streams=ALL_STREAMS,
        cadence=Cadence(1, 1),
        settings=WatchSettings(update_sample_size=10**9),  # exact updates: the oracle is exact
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_recorded_rows_equal_independent_hooks(name):
    case = CASES[name]
    torch.manual_seed(0)
    names = [n for n, _ in case.build().named_modules()]
    run = train(case, collector_factory, steps=STEPS, oracle_sites=names)
    c, oracle = run["collector"], run["oracle"]
    rec = recorded(c)
    checked = 0
    for row in c.rows:
        assert row.site_id is not None, f"{row.site}/{row.stream} never got a catalog entry"
        for step in range(STEPS):
            key = (row.site, row.stream, step)
            assert key in rec, f"no record for {key}"
            presence, spine, notes = rec[key]
            want = oracle.numbers(row.site, row.stream, step)
            if want is not None:
                assert presence is Presence.OBSERVED, (key, presence, notes)
                got = spine_numbers(spine)
                assert close(got, want), (key, got, want)
                checked += 1
            elif (row.site, row.stream) in case.unsupported:
                assert presence is Presence.UNSUPPORTED, (key, presence)
                reason = case.unsupported[(row.site, row.stream)]
                assert any(n.startswith(f"unsupported:{reason}") for n in notes), notes
            else:
                assert presence is Presence.SITE_ABSENT, (key, presence)
    assert checked > 0
    for site in case.never_run:
        assert rec[(site, "activation", 0)][0] is Presence.SITE_ABSENT


@pytest.mark.parametrize("name", sorted(CASES))
def test_observation_is_bitwise_pure(name):
    case = CASES[name]
    control = train(case, None, steps=STEPS)
    observed = train(case, collector_factory, steps=STEPS)
    assert torch.equal(control["losses"], observed["losses"])
    for k, v in control["state"].items():
        assert torch.equal(v, observed["state"][k]), k


@pytest.mark.parametrize("name", [n for n, c in sorted(CASES.items()) if c.variable_length])
def test_site_count_is_constant_across_sequence_lengths(name):
    case = CASES[name]
    run = train(case, collector_factory, steps=8, evaluations=False)
    c = run["collector"]
    assert [s for s in c.sites if s.ended_step is not None] == []
    assert len(c.sites) == len({r.site for r in c.rows})
    totals = {
        rb.block.optimizer_step: b.spines[0][0]
        for rb in c.ring.blocks()
        for b in rb.batches
        if b.stream.value == "activation"
    }
    assert len(set(totals.values())) > 1  # per-step sizes are still recorded (they vary)


def test_sparse_gradient_is_reduced_over_its_values_with_a_disclosure():
    run = train(CASES["sparse"], collector_factory, steps=2, oracle_sites=["emb", "fc"])
    rec = recorded(run["collector"])
    presence, _, notes = rec[("emb.weight", "gradient", 1)]
    assert presence is Presence.OBSERVED
    assert "sparse_values" in notes


@pytest.mark.parametrize("name", sorted(CASES))
def test_rows_between_quiet_steps_equal_those_of_a_collector_that_never_rests(name):
    """Quiet steps take the module hooks off and skip the surgery check; the rows of the due
    steps around them are bitwise those of an every-step collector (whose hooks never rest)."""
    case = CASES[name]

    def every(cadence):
        def factory(model, opt):
            return HistoryCollector(
                model,
                sites=everything,
                streams=ALL_STREAMS,
                cadence=cadence,
                settings=WatchSettings(update_sample_size=16),
            )

        return factory

    dense = recorded(train(case, every(Cadence(1, 3)), steps=STEPS)["collector"])
    sparse = recorded(train(case, every(Cadence(3, 3)), steps=STEPS)["collector"])
    assert sparse and {k[2] for k in sparse} == {0, 3}
    for key, (presence, spine, notes) in sparse.items():
        want = dense[key]
        assert (presence, notes) == want[0::2], key
        assert torch.equal(
            torch.from_numpy(spine).nan_to_num(7.0), torch.from_numpy(want[1]).nan_to_num(7.0)
        ), key
