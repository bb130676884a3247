"""The flight recorder under the Lightning and Hugging Face callbacks (real Trainers, CPU).

The callbacks take ``settings=WatchSettings(flight_recorder=...)`` like the collector. A
predicate trigger fires at step 3: its saved window holds every step 0..3 (whatever the
cadence), its ``grad_rms`` rows equal the gradient each framework's optimizer consumed (read by
an independent callback, float64), and the next steps are recorded densely.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import stepscope as ss
from stepscope.forensics import Predicate

pytest.importorskip("lightning")
pytest.importorskip("transformers")

TRIGGER, DENSE = 3, 2


def recorder() -> ss.FlightRecorder:
    at = Predicate(lambda r: r.step == TRIGGER, name="at_step_3")
    return ss.FlightRecorder(window=8, dense_steps=DENSE, triggers=(at,))


def check(run_dir: str, oracle_grads: list[dict], param: str) -> None:
    spikes = ss.open_run(run_dir).spikes()
    assert [s.step for s in spikes] == [TRIGGER] and spikes[0].triggers == ["at_step_3"]
    steps, got = spikes[0].column(param, "grad_rms")
    assert steps.tolist() == list(range(TRIGGER + 1))
    want = [math.sqrt(g[param][2] / g[param][0]) for g in oracle_grads[: TRIGGER + 1]]
    np.testing.assert_allclose(got, want, rtol=2e-5, equal_nan=False)
    dense = ss.open_run(run_dir).series(param, "gradient", "sum_squares").steps.tolist()
    assert dense[:3] == [0, TRIGGER + 1, TRIGGER + 2]  # cadence 10: only 0, then the dense steps


def test_lightning_callback_runs_the_flight_recorder(tmp_path: Path) -> None:
    from stepscope.integrations.lightning import StepscopeCallback
    from tests.integrations.test_lightning import Oracle, fit

    oracle = Oracle()
    settings = ss.WatchSettings(durable=False, flight_recorder=recorder())
    fit(tmp_path, [StepscopeCallback(settings=settings), oracle])
    check(str(tmp_path / "stepscope"), oracle.grads, "fc.weight")


def test_transformers_callback_runs_the_flight_recorder(tmp_path: Path) -> None:
    from stepscope.integrations.transformers import StepscopeCallback
    from tests.integrations.test_transformers import Oracle, train

    oracle = Oracle()
    settings = ss.WatchSettings(durable=False, flight_recorder=recorder())
    train(tmp_path, [StepscopeCallback(settings=settings), oracle])
    check(str(tmp_path / "stepscope"), oracle.grads, "transformer.h.0.mlp.c_fc.weight")
