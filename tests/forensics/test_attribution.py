"""Attribution: the layer that left its own trailing range first, by brute force."""

from __future__ import annotations

import numpy as np

from stepscope.forensics.attribution import first_movers
from stepscope.forensics.channels import Channel


def window(n: int = 48, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Channel]]:
    chans = [
        Channel("<run>", "run", "loss"),
        Channel("a", "update", "update_rms"),
        Channel("b", "gradient", "grad_rms"),
        Channel("c", "activation", "act_absmax"),
    ]
    rng = np.random.default_rng(seed)
    values = np.exp(rng.normal(0.0, 0.05, (n, len(chans))))
    return np.arange(100, 100 + n), values, np.ones_like(values, dtype=bool), chans


def test_layers_are_ranked_by_the_step_they_left_their_range() -> None:
    steps, values, present, chans = window()
    values[44:, 2] *= 20  # b first, at step 144
    values[46:, 3] *= 20  # c two steps later
    values[47, 0] *= 50  # the loss: not a layer
    movers = first_movers(steps, values, present, chans, trigger_step=147)
    assert [(m.site, m.step) for m in movers] == [("b", 144), ("c", 146)]
    assert movers[0].field == "grad_rms" and movers[0].value > 10 * movers[0].center


def test_a_layer_that_quietened_is_not_a_mover_and_nothing_after_the_trigger_counts() -> None:
    steps, values, present, chans = window()
    values[40:, 1] /= 100  # a falls
    values[47, 2] *= 100  # b jumps after the trigger at 146
    assert first_movers(steps, values, present, chans, trigger_step=146) == []


def test_unobserved_steps_are_skipped_never_read_as_zero() -> None:
    steps, values, present, chans = window()
    present[30:44, 2] = False
    values[30:44, 2] = 0.0  # what a zero-filled reader would see
    values[45, 2] *= 30
    movers = first_movers(steps, values, present, chans, trigger_step=146)
    assert [(m.site, m.step) for m in movers] == [("b", 145)]
