"""Triggers against brute-force statistics: robust z-scores, non-finite values, predicates."""

from __future__ import annotations

import math

import numpy as np
import pytest

import stepscope as ss
from stepscope.forensics import (
    GradNormSpike,
    LossSpike,
    NonFinite,
    Predicate,
    StepReading,
    UpdateRatioSpike,
)
from stepscope.forensics.channels import build_channels
from stepscope.forensics.detector import check_triggers, robust_z

CHANNELS = build_channels(["a.weight", "b.weight"], ["a"], ("gradient", "update", "activation"))
COL = {c.label: i for i, c in enumerate(CHANNELS)}


def reading(step: int, values: dict[str, float] | None = None) -> StepReading:
    v = np.full(len(CHANNELS), np.nan)
    p = np.zeros(len(CHANNELS), dtype=bool)
    for label, x in (values or {}).items():
        j = COL[label]
        v[j], p[j] = x, True
    return StepReading(step, CHANNELS, v, p)


def history(n: int, label: str, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.full((n, len(CHANNELS)), np.nan)
    p = np.zeros((n, len(CHANNELS)), dtype=bool)
    v[:, COL[label]], p[:, COL[label]] = values, True
    return v, p


def test_robust_z_is_the_median_and_mad_by_brute_force() -> None:
    h = np.array([3.0, 1.0, 2.0, 10.0, 2.5])
    med = sorted(h)[2]
    mad = sorted(abs(x - med) for x in h)[2]
    z, center, scale = robust_z(h, 7.0, log=False)
    assert center == med and scale == pytest.approx(1.4826 * mad)
    assert z == pytest.approx((7.0 - med) / (1.4826 * mad))
    _, cl, _ = robust_z(h, 7.0, log=True)
    assert cl == pytest.approx(float(np.median(np.log(h))))


def test_loss_spike_fires_above_its_threshold_only_upwards() -> None:
    rng = np.random.default_rng(0)
    noise = 2.0 + 0.05 * rng.standard_normal(40)
    v, p = history(40, "<run>/loss", noise)
    trig = LossSpike(threshold=6.0)
    med = float(np.median(noise))
    scale = 1.4826 * float(np.median(abs(noise - med)))
    just_above, just_below = med + 6.01 * scale, med + 5.99 * scale
    assert trig.check(reading(40, {"<run>/loss": just_above}), v, p)[0].channel == "<run>/loss"
    assert trig.check(reading(40, {"<run>/loss": just_below}), v, p) == []
    assert trig.check(reading(40, {"<run>/loss": med - 50 * scale}), v, p) == []  # a fall
    c = trig.check(reading(40, {"<run>/loss": med + 20 * scale}), v, p)[0]
    assert c.center == pytest.approx(med) and c.limit == pytest.approx(med + 6 * scale)
    assert c.z == pytest.approx(20.0)


def test_a_spike_needs_min_history_earlier_values() -> None:
    v, p = history(10, "<run>/grad_norm", np.ones(10))
    assert GradNormSpike(min_history=16).check(reading(10, {"<run>/grad_norm": 1e6}), v, p) == []
    v, p = history(16, "<run>/grad_norm", np.ones(16))
    assert GradNormSpike(min_history=16).check(reading(16, {"<run>/grad_norm": 1e6}), v, p)


def test_update_ratio_spike_names_each_site_against_its_own_range() -> None:
    v = np.full((30, len(CHANNELS)), np.nan)
    p = np.zeros((30, len(CHANNELS)), dtype=bool)
    a, b = COL["a.weight/update_ratio"], COL["b.weight/update_ratio"]
    v[:, a], v[:, b], p[:, a], p[:, b] = 1e-3, 1e-5, True, True
    r = reading(30, {"a.weight/update_ratio": 1e-3, "b.weight/update_ratio": 1e-3})
    got = UpdateRatioSpike().check(r, v, p)
    assert [c.channel for c in got] == ["b.weight/update_ratio"]  # 100x its own, a unchanged


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_fires_for_any_observed_non_finite_value(bad: float) -> None:
    r = reading(5, {"a.weight/grad_rms": bad, "a/act_absmax": 1.0})
    got = NonFinite().check(r, np.zeros((0, len(CHANNELS))), np.zeros((0, len(CHANNELS)), bool))
    assert [c.channel for c in got] == ["a.weight/grad_rms"]
    assert NonFinite().check(reading(5, {"a/act_absmax": 1.0}), None, None) == []  # type: ignore[arg-type]


def test_a_predicate_fires_when_it_says_so_and_a_raising_one_is_switched_off() -> None:
    pred = Predicate(lambda r: (r.get("a", "act_absmax") or 0) > 5, name="big_activation")
    assert pred.check(reading(1, {"a/act_absmax": 6.0}), None, None)[0].trigger == "big_activation"  # type: ignore[arg-type]
    assert pred.check(reading(1, {"a/act_absmax": 4.0}), None, None) == []  # type: ignore[arg-type]

    def boom(r: StepReading) -> bool:
        raise ValueError("user bug")

    failed: set[str] = set()
    with pytest.warns(RuntimeWarning, match="user bug"):
        assert check_triggers([Predicate(boom, "boom")], reading(1), None, None, failed) == []  # type: ignore[arg-type]
    assert failed == {"boom"}
    assert check_triggers([Predicate(boom, "boom")], reading(2), None, None, failed) == []  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "make",
    [
        lambda: LossSpike(threshold=0),
        lambda: LossSpike(threshold=math.nan),
        lambda: LossSpike(key=""),
        lambda: GradNormSpike(trailing=8, min_history=16),
        lambda: Predicate(3),  # type: ignore[arg-type]
        lambda: ss.FlightRecorder(window=2),
        lambda: ss.FlightRecorder(streams=("histogram",)),
        lambda: ss.FlightRecorder(triggers=[lambda r: True]),  # type: ignore[list-item]
    ],
)
def test_bad_settings_refuse_settings_invalid(make) -> None:
    with pytest.raises(ss.Refusal) as e:
        make()
    assert e.value.code == "settings_invalid" and e.value.remedies


def test_watch_settings_takes_only_a_flight_recorder() -> None:
    with pytest.raises(TypeError, match="flight_recorder"):
        ss.WatchSettings(flight_recorder={"window": 64})  # type: ignore[arg-type]
    assert ss.WatchSettings(flight_recorder=ss.FlightRecorder()).flight_recorder.window == 64
