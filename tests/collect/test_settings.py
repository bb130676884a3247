"""Cadence schedules: the due-step table answers exactly what each Cadence answers."""

import pytest

from stepscope.collect.cadence import DEFAULT_CADENCE, Cadence, DueTable

STREAMS = ("activation", "gradient", "update")


def _asked(cadences, step):
    spine = {s: cadences[s].spine_due(step) for s in STREAMS}
    return spine, {s: cadences[s].histogram_due(step) for s in STREAMS}


@pytest.mark.parametrize(
    "cadences",
    [
        {s: DEFAULT_CADENCE[s] for s in STREAMS},
        {"activation": Cadence(1, 2), "gradient": Cadence(3, 0), "update": Cadence(7, None)},
        {"activation": Cadence(4, 6), "gradient": Cadence(5, 9), "update": Cadence(2, 10)},
        {"activation": Cadence(lambda k: k in (3, 17), 4), "gradient": Cadence(2), "update": 1},
        {"activation": Cadence(997, 991), "gradient": Cadence(2), "update": Cadence(3)},  # lcm
    ],
    ids=["default", "no_histograms", "coprime", "predicate", "period_too_long"],
)
def test_the_due_table_agrees_with_every_cadence_at_every_step(cadences):
    cadences = {s: c if isinstance(c, Cadence) else Cadence(c) for s, c in cadences.items()}
    table = DueTable(cadences, STREAMS)
    for step in [*range(0, 450), 9_999, 10_000, 123_456]:
        assert table.at(step) == _asked(cadences, step), step
    got = table.at(0)
    with pytest.raises(TypeError):  # shared between steps, so read-only
        got[0]["activation"] = "changed"  # type: ignore[index]
    assert table.at(0) == _asked(cadences, 0)


def test_the_due_table_knows_which_cadences_it_was_built_for():
    cadences = {s: DEFAULT_CADENCE[s] for s in STREAMS}
    table = DueTable(cadences, STREAMS)
    assert table.matches(dict(cadences))
    assert table.matches({**cadences, "gradient": Cadence(10, 100)})  # equal: same answers
    assert not table.matches({**cadences, "gradient": Cadence(10, 50)})
    assert not table.matches({s: cadences[s] for s in STREAMS[:2]})
    assert (
        table.period == 100
        and DueTable({s: Cadence(997, 991) for s in STREAMS}, STREAMS).period == 0
    )
