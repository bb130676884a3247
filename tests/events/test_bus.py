"""EventBus: delivery, bounded retention, and isolation of failing subscribers."""

from __future__ import annotations

import filecmp
import json
import warnings

import pytest

from stepscope.errors import Refusal
from stepscope.events import (
    MAX_CONSECUTIVE_FAILURES,
    Axes,
    EventBus,
    ScalarEvent,
    Subscriber,
    SubscriberFailureWarning,
)


class Recorder(Subscriber):
    def __init__(self):
        self.batches = []
        self.closed = 0

    def on_events(self, events):
        self.batches.append(list(events))

    def close(self):
        self.closed += 1


class Raiser(Subscriber):
    """Raises on every delivery (or only where ``fail(n)`` says so)."""

    def __init__(self, fail=lambda n: True):
        self.calls = 0
        self.fail = fail

    def on_events(self, events):
        self.calls += 1
        if self.fail(self.calls):
            raise RuntimeError(f"boom {self.calls}")


def _scalar(step):
    return ScalarEvent("loss", Axes(step), float(step))


def test_every_subscriber_gets_every_batch_in_order():
    bus = EventBus()
    a, b = bus.subscribe(Recorder()), bus.subscribe(Recorder())
    for step in range(3):
        bus.publish([_scalar(step)])
    assert [[e.optimizer_step for e in batch] for batch in a.batches] == [[0], [1], [2]]
    assert a.batches == b.batches
    bus.close()
    bus.close()
    assert (a.closed, b.closed) == (1, 1)


def test_only_the_most_recent_capacity_events_are_kept():
    bus = EventBus(capacity=5)
    bus.publish([_scalar(i) for i in range(12)])
    assert [e.optimizer_step for e in bus.recent()] == [7, 8, 9, 10, 11]
    assert bus.published == 12
    assert bus.recent("verdict") == ()
    with pytest.raises(Refusal) as err:
        EventBus(capacity=0)
    assert err.value.code == "settings_invalid"


def test_non_events_are_refused():
    with pytest.raises(Refusal) as err:
        EventBus().publish([{"kind": "scalar"}])
    assert err.value.code == "event_invalid"
    with pytest.raises(Refusal):
        EventBus().subscribe(object())


def test_raising_subscriber_is_disabled_after_exactly_eight_failures_with_one_warning():
    bus = EventBus()
    bad, good = bus.subscribe(Raiser()), bus.subscribe(Recorder())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(20):
            bus.publish([_scalar(step)])
    assert MAX_CONSECUTIVE_FAILURES == 8
    assert bad.calls == 8  # never called again once disabled
    status = bus.status(bad)
    assert (status.enabled, status.failures, status.consecutive_failures) == (False, 8, 8)
    assert "boom 8" in status.last_error
    ours = [w for w in caught if issubclass(w.category, SubscriberFailureWarning)]
    assert len(ours) == 1 and "Raiser" in str(ours[0].message)
    assert len(good.batches) == 20  # the others never noticed
    assert bus.active
    bus.unsubscribe(good)
    assert not bus.active  # only the disabled one is left: nothing to convert for


def test_a_success_resets_the_consecutive_count():
    # fails 7 times, succeeds once, then fails forever: disabled at call 7 + 1 + 8 = 16
    bus = EventBus()
    flaky = bus.subscribe(Raiser(fail=lambda n: n != 8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(30):
            bus.publish([_scalar(step)])
    assert flaky.calls == 16
    assert bus.status(flaky).failures == 15
    assert len([w for w in caught if issubclass(w.category, SubscriberFailureWarning)]) == 1


def test_a_failing_close_is_warned_not_raised():
    class BadClose(Recorder):
        def close(self):
            raise OSError("disk gone")

    bus = EventBus()
    bus.subscribe(BadClose())
    with pytest.warns(SubscriberFailureWarning, match="disk gone"):
        bus.close()


def test_keyboard_interrupt_is_not_swallowed():
    class Interrupt(Subscriber):
        def on_events(self, events):
            raise KeyboardInterrupt

    bus = EventBus()
    bus.subscribe(Interrupt())
    with pytest.raises(KeyboardInterrupt):
        bus.publish([_scalar(0)])


def test_subscribers_may_only_return_check_events():
    class Echo(Subscriber):
        def on_events(self, events):
            return list(events)  # source user_scalar: not allowed back on the bus

    bus = EventBus()
    echo = bus.subscribe(Echo())
    with pytest.warns(SubscriberFailureWarning, match="source 'check'"):
        bus.publish([_scalar(0)])
    assert bus.status(echo).failures == 1
    assert bus.published == 1


def test_artifact_is_identical_with_and_without_a_failing_subscriber(ev, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bad = Raiser()
        noisy = ev.train(tmp_path / "with", n_steps=12, subscribers=[bad])
    clean = ev.train(tmp_path / "without", n_steps=12)
    assert bad.calls == 8
    assert noisy.bus.status(bad).enabled is False
    assert len([w for w in caught if issubclass(w.category, SubscriberFailureWarning)]) == 1
    a, b = tmp_path / "with", tmp_path / "without"
    chunks = sorted(p.name for p in (a / "chunks").iterdir())
    assert chunks == sorted(p.name for p in (b / "chunks").iterdir()) and len(chunks) > 10
    _, mismatch, errors = filecmp.cmpfiles(a / "chunks", b / "chunks", chunks, shallow=False)
    assert mismatch == [] and errors == []
    for name in ("catalog.json", "manifest.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    # index.json seals each log's sha256, and the log rows carry commit wall-times: compare the rest
    ia, ib = (json.loads((d / "index.json").read_text()) for d in (a, b))
    for key in ("logs", "manifest_sha256", "catalog_sha256"):
        assert ia[key] == ib[key]
    # the published events are the same too (the subscriber changed nothing upstream)
    assert [len(x) for x in noisy.events] == [len(x) for x in clean.events]
