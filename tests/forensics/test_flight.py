"""Spike forensics end to end on the GPT-like test model.

A one-step learning-rate x100 on one layer (``h.0.mlp.0``) at step ``K``: the trigger fires at
``K``, the saved window's rows equal the test's own float64 every-step reading of the same
layers, the first layer attributed is the injected one, and the collector's cadence is dense
for the ``M`` steps after it. A run without injection fires nothing.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import stepscope as ss
from stepscope.forensics.archive import ForensicsFiles
from tests.forensics.spikekit import INJECTED, train

K, M, STEPS = 100, 8, 124


@pytest.fixture(scope="module")
def injected(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("spike") / "run"
    events = ss.EventBus()
    seen: list = []

    class Keep:
        active = True

        def on_events(self, evs):
            seen.extend(evs)
            return []

    events.subscribe(Keep())
    every = ("gradient", "update", "parameter", "activation")  # every field the recorder has
    rec = ss.FlightRecorder(window=64, dense_steps=M, streams=every)
    settings = ss.WatchSettings(output_dir=str(path), flight_recorder=rec, event_bus=events)
    trained = train(STEPS, settings, inject_at=K)
    return path, trained, seen


def test_trigger_fires_at_the_injected_step_and_names_the_injected_layer_first(injected) -> None:
    path, _, _ = injected
    spikes = ss.open_run(path).spikes()
    assert [s.step for s in spikes] == [K]
    spike = spikes[0]
    assert "update_ratio_spike" in spike.triggers
    assert {c.channel.split("/")[0] for c in spike.crossings} <= {
        f"{INJECTED}.weight",
        f"{INJECTED}.bias",
    }
    assert spike.first, "no layer left its range before the trigger"
    assert spike.first[0].site.startswith(INJECTED + ".")
    assert spike.first[0].step == K
    assert spike.first[0].field in ("update_rms", "update_ratio")


def test_saved_window_equals_an_independent_every_step_reading(injected) -> None:
    path, trained, _ = injected
    spike = ss.open_run(path).spikes()[0]
    assert spike.window is not None
    steps = spike.window.steps
    assert steps.tolist() == list(range(K - 63, K + 1))  # 64 rows, every step, up to the trigger
    compared = 0
    for (site, field), by_step in trained.independent.values.items():
        try:
            got_steps, got = spike.column(site, field)
        except ss.Refusal:
            continue  # a module the recorder does not watch (none here but the model's root)
        want = np.array([by_step[int(s)] for s in got_steps])  # read at every step
        assert np.isfinite(want).all() and np.isfinite(got).all(), f"{site}/{field}"
        np.testing.assert_allclose(
            got, want, rtol=2e-5, atol=1e-12, equal_nan=False, err_msg=f"{site}/{field}"
        )
        compared += 1
    fields = {f for (_, f) in trained.independent.values}
    assert fields == {"grad_rms", "update_rms", "update_ratio", "param_rms", "act_absmax"}
    assert compared >= 40  # every parameter's four fields and the activation sites
    loss_steps, loss = spike.column("<run>", "loss")
    np.testing.assert_allclose(loss, [trained.losses[s] for s in loss_steps], rtol=1e-6)


def test_cadence_is_dense_for_m_steps_after_the_trigger_with_its_reason(injected) -> None:
    path, _, _ = injected
    run = ss.open_run(path)
    for stream in ("gradient", "update", "parameter"):
        got = run.series(f"{INJECTED}.weight", stream, "sum_squares").steps
        want = sorted({s for s in range(STEPS) if s % 10 == 0} | set(range(K + 1, K + M + 1)))
        assert got.tolist() == want, stream
    act = run.series(INJECTED, "activation", "absmax").steps.tolist()
    assert set(range(K + 1, K + M + 1)) <= set(act)
    rows = ForensicsFiles(path).triggers()
    assert rows[0]["dense"] == {
        "from_step": K + 1,
        "to_step": K + M,
        "spine": 1,
        "reason": f"flight recorder trigger update_ratio_spike at step {K}",
    }


def test_trigger_is_a_verdict_event_with_what_crossed(injected) -> None:
    _, _, seen = injected
    verdicts = [e for e in seen if e.kind.value == "verdict" and e.name.startswith("forensics/")]
    assert verdicts and {v.optimizer_step for v in verdicts} == {K}
    v = verdicts[0]
    assert v.name == "forensics/update_ratio_spike"
    assert v.verdict.check == "flight_recorder"
    assert v.verdict.observed is not None and v.verdict.observed > v.verdict.upper


def test_cli_spikes_lists_the_trigger(injected, capsys: pytest.CaptureFixture[str]) -> None:
    from stepscope.cli import main

    path, _, _ = injected
    assert main(["spikes", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["step"] for s in doc["spikes"]] == [K]
    assert doc["spikes"][0]["first"][0]["site"].startswith(INJECTED)
    assert main(["spikes", str(path)]) == 0
    text = capsys.readouterr().out
    assert f"step {K}" in text and INJECTED in text


def test_normal_training_noise_fires_nothing(tmp_path) -> None:
    """No injection, 300 steps of minibatch noise: no trigger (false positives: 0 of 300 steps)."""
    rec = ss.FlightRecorder(window=64, dense_steps=M)
    settings = ss.WatchSettings(output_dir=str(tmp_path / "run"), flight_recorder=rec)
    trained = train(300, settings, inject_at=None, seed=3)
    assert trained.collector.forensics.rows == []
    assert ss.open_run(tmp_path / "run").spikes() == []


def test_ram_only_run_keeps_its_triggers_in_memory() -> None:
    rec = ss.FlightRecorder(window=32, dense_steps=4)
    settings = ss.WatchSettings(ram_policy="drop_oldest", flight_recorder=rec)
    trained = train(60, settings, inject_at=40)
    spikes = trained.collector.forensics.spikes()
    assert [s.step for s in spikes] == [40]
    assert spikes[0].first[0].site.startswith(INJECTED)


def test_a_corrupted_batch_fires_the_loss_spike_at_its_own_step() -> None:
    """The batch of step 60 has its logits scaled by 30: its loss jumps at that very step."""
    rec = ss.FlightRecorder(window=64, dense_steps=4, triggers=(ss.forensics.LossSpike(),))
    settings = ss.WatchSettings(ram_policy="drop_oldest", flight_recorder=rec)
    trained = train(64, settings, corrupt_at=60)
    (spike,) = trained.collector.forensics.spikes()
    assert spike.step == 60 and spike.triggers == ["loss_spike"]
    (c,) = spike.crossings
    assert c.channel == "<run>/loss" and c.value == trained.losses[60] > c.limit
