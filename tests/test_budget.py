"""``stepscope.budget.densest_cadence``: the one cadence rule, against a brute-force search, and
both choosers (the collector's auto cadence, the probe's) built on it."""

from __future__ import annotations

import random
import statistics
from fractions import Fraction

import pytest

from stepscope.budget import densest_cadence
from stepscope.collect.cadence import choose_stream_cadences
from stepscope.probe.cadence import choose_cadence


def brute_force(cost: float, budget: float) -> int:
    """The smallest k >= 1 with cost / k <= budget, in exact rational arithmetic."""
    c, b = Fraction(cost), Fraction(budget)
    k = 1
    while c / k > b:
        k += 1
    return k


def test_matches_brute_force_on_random_costs():
    rng = random.Random(7)
    checked = 0
    while checked < 300:
        cost, budget = rng.uniform(0, 2.0), rng.uniform(1e-3, 0.5)
        ratio = Fraction(cost) / Fraction(budget)
        if abs(ratio - round(ratio)) < Fraction(1, 10**9):
            continue  # the 1e-12 round-off allowance decides there; see the boundary test
        assert densest_cadence(cost, budget) == brute_force(cost, budget)
        checked += 1


@pytest.mark.parametrize(("cost", "budget", "k"), [(0.3, 0.1, 3), (0.0, 0.1, 1), (0.1, 0.1, 1)])
def test_a_ratio_on_an_integer_is_that_integer(cost, budget, k):
    assert densest_cadence(cost, budget) == k  # 0.3 / 0.1 == 2.9999999999999996 in floats


@pytest.mark.parametrize(("cost", "budget"), [(1.0, 0.0), (1.0, -1.0), (-1.0, 1.0)])
def test_refuses_impossible_inputs(cost, budget):
    with pytest.raises(ValueError):
        densest_cadence(cost, budget)


def test_both_choosers_apply_the_one_rule():
    rng = random.Random(11)
    for _ in range(50):
        probe = [rng.uniform(0.01, 1.0) for _ in range(3)]
        step = [rng.uniform(0.05, 0.5) for _ in range(3)]
        want = densest_cadence(statistics.median(probe), 0.05 * statistics.median(step))
        assert choose_cadence(probe, step, target=0.05).cadence_steps == want

        spine, shared, fixed = rng.uniform(0, 0.01), rng.uniform(0, 0.01), rng.uniform(0, 0.005)
        hist, train = rng.uniform(0, 0.02), rng.uniform(0.2, 1.0)
        choice = choose_stream_cadences(
            {"activation": [spine], "gradient": [spine / 2]},
            [shared],
            [train],
            target=0.05,
            histogram_seconds={"activation": [hist], "gradient": [hist]},
            fixed_seconds=[fixed],
        )
        budget = (0.05 * train - fixed) / 2
        if budget <= 0:
            continue
        for stream, c in (("activation", spine), ("gradient", spine / 2)):
            cost = c + shared / 2 + hist / 10
            assert choice.cadences[stream].spine == min(10_000, densest_cadence(cost, budget))
