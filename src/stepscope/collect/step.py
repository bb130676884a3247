"""The step: what one step has seen, its handle, its loss-scaler facts and telemetry window.

The bottom of :mod:`stepscope.collect`: every other module of it imports this one. The collector
keeps the step being recorded in an :class:`OpenStep`; its hooks read it and write what they
observe into the :class:`StepState` it holds (only the collector begins or ends a step). The user
declares what the collector cannot see on the :class:`StepTransaction` of ``collector.step()``;
at the step boundary :mod:`stepscope.collect.write` turns the state into the step's record.

Loss-scaler inspection: is a gradient read now scaled or unscaled, and what scale is in force.

Only public facts of a ``torch.amp.GradScaler`` are read (its per-optimizer stage and
``get_scale()``); nothing is changed.

The telemetry window: work the user does *for* telemetry, outside the collector's hooks.

``with collector.telemetry(): ...`` brackets work such as a dense probe's measurement, its
serialisation, or a parameter snapshot. While a window is open:

* its wall-clock seconds are charged to the current step's ``clock/telemetry_seconds`` (the
  step being recorded, or the next one between steps), never to the isolated training seconds
  ``clock/training_seconds`` of a step transaction it runs inside;
* the collector's hooks record nothing: forwards, backwards and optimizer steps run inside the
  window never reach the step's activation, gradient, parameter or update rows.

Windows nest; only the outermost one is timed.

Example
-------
>>> import torch, stepscope as ss
>>> model = torch.nn.Linear(4, 2)
>>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
>>> with ss.HistoryCollector(model, sites="Linear") as c:
...     with c.step(opt, examples=8):
...         model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
...         with c.telemetry():
...             _ = model(torch.randn(100, 4))  # a probe forward: not folded into the step
>>> int(c.last_batches[0].spines[0, 0])  # the activation row counts the 8x2 training output
16
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

__all__ = ["OpenStep", "StepScope", "StepTransaction", "TelemetryWindow"]

# ------------------------------------------------------------------ (stepstate)


@dataclass(slots=True)
class StepState:
    """What the current step has seen so far (host-side bookkeeping only)."""

    step: int
    spine_due: Mapping[str, bool]  # read-only: shared by the steps of one cadence residue
    hist_due: Mapping[str, bool]
    explicit: bool = False
    stepped: bool = False
    grads_taken: bool = False
    scale_grad: str = "unknown"
    examples: int | None = None
    epoch: int | None = None
    clipped: bool | None = None
    micro_batches: int | None = None
    telemetry_s: float = 0.0
    started: float = 0.0
    window_from: float = 0.0  # telemetry_s when the step's training-clock window opened
    carried_s: float = 0.0  # the previous step's write/commit/publish, charged to this step
    stream_s: dict[str, float] = field(default_factory=dict)  # reduction seconds per stream
    activations_quiet: bool = False  # neither activation stream is due: hooks return at once
    optimizer_quiet: bool = False  # no gradient, parameter or update spine is due
    hook_s: float = 0.0  # seconds inside the collector's hooks not charged as telemetry
    hook_calls: int = 0  # module and optimizer hook calls (each also pays torch's dispatch)
    unsupported: dict[int, str] = field(default_factory=dict)  # row index -> reason
    row_notes: dict[int, str] = field(default_factory=dict)  # row index -> extra disclosure
    failed: dict[int, str] = field(default_factory=dict)  # row index -> exception type
    structure_checked: bool = False  # model surgery looked for this step
    grad_rows: set[int] = field(default_factory=set)  # gradient rows read this step
    param_rows: set[int] = field(default_factory=set)  # parameter rows read this step
    optimizer_steps: dict[int, int] = field(default_factory=dict)  # id(watch) -> step() calls
    stepped_params: set[int] = field(default_factory=set)  # ids of shared parameters stepped
    skipped: bool = False  # an iteration ended (scaler.update) without an optimizer step
    scale_in_force: Any = None  # loss scale of this iteration (tensor or float; None: none)
    scaler_marker: Any = None  # the scaler's update marker when the iteration began

    def open_transaction(self, examples: int | None, epoch: int | None, scaler: Any) -> None:
        """An explicit transaction opens on this step: its declared facts, and the scaler's
        scale and update marker before ``scaler.update()`` changes them."""
        self.explicit, self.examples, self.epoch = True, examples, epoch
        self.scale_in_force = scale_in_force(scaler)
        self.scaler_marker = None if scaler is None else update_marker(scaler)

    def charge(self, stream: str | None, seconds: float) -> None:
        """Count ``seconds`` of telemetry work (for ``stream``, when it is one stream's)."""
        self.telemetry_s += seconds
        if stream is not None:
            self.stream_s[stream] = self.stream_s.get(stream, 0.0) + seconds


class StepScope:
    """What ``collector.step(...)`` returns: the context manager of one step transaction.

    Entering it opens the transaction (checks, optimizer watches, the step's training-clock
    window) and yields the step's :class:`StepTransaction`; leaving it writes the step, or,
    when an exception escapes the block, closes the collector and lets the exception propagate.
    A plain class rather than a generator: it runs at every training step.
    """

    __slots__ = ("_args", "_collector", "_state")

    def __init__(
        self, collector: Any, optimizer: Any, scaler: Any, examples: Any, epoch: Any
    ) -> None:
        self._collector, self._args = collector, (optimizer, scaler, examples, epoch)
        self._state: StepState | None = None

    def __enter__(self) -> StepTransaction:
        c = self._collector
        state = self._state = c._open_transaction(*self._args)
        return StepTransaction(state, c._log_in)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        state, self._state = self._state, None
        if state is not None:
            self._collector._close_transaction(state, self._args[1], exc_type is not None)
        return False  # an exception from the block propagates


class StepTransaction:
    """Handle yielded by :meth:`HistoryCollector.step`; lets the user declare step facts."""

    def __init__(
        self, state: StepState, log: Callable[[StepState, str, Any, int | None], None]
    ) -> None:
        self._s, self._log = state, log  # log: the collector's (it knows where the step is)

    @property
    def step(self) -> int:
        """The optimizer step being recorded (0-based)."""
        return self._s.step

    def declare(
        self,
        *,
        clipped: bool | None = None,
        micro_batches: int | None = None,
        examples: int | None = None,
    ) -> None:
        """Record facts the collector cannot see (gradient clipping, micro-batch count).

        ``examples`` replaces the count given to :meth:`HistoryCollector.step` (a trainer
        callback knows it only after the step's last micro-batch).
        """
        if clipped is not None:
            self._s.clipped = bool(clipped)
        if micro_batches is not None:
            self._s.micro_batches = int(micro_batches)
        if examples is not None:
            self._s.examples = int(examples)

    def log(self, name: str, value: float | torch.Tensor, step: int | None = None) -> None:
        """A user scalar for this step (batched to the host at the step boundary).

        Called after the step's ``with`` block ended, it warns once and records the value at
        this step (:mod:`stepscope.collect.misuse`).
        """
        self._log(self._s, name, value, step)


# ------------------------------------------------------------------ (scaler)
def grad_scale_status(scaler: Any, explicit: bool) -> str:
    """``scaled``/``unscaled``/``unknown`` for parameter gradients read right now.

    Outside an explicit transaction the collector cannot know (``unknown``); inside one without a
    scaler the gradients are unscaled; with a scaler, ``GradScaler.step`` unscales before it
    calls ``optimizer.step``, which its per-optimizer stage records.
    """
    if not explicit:
        return "unknown"
    if scaler is None:
        return "unscaled"  # the explicit transaction declared no loss scaling
    try:
        stages = [str(s.get("stage")) for s in scaler._per_optimizer_states.values()]
        return "unscaled" if any("UNSCALED" in s or "STEPPED" in s for s in stages) else "scaled"
    except AttributeError:
        return "unknown"


def scale_grad_of(stream: str, grad_status: str, explicit: bool, scaler: Any) -> str | None:
    """The ``scale_grad`` field of a stream's batch (``None`` for non-gradient streams)."""
    if stream == "gradient":
        return grad_status
    if stream == "activation_grad":  # taken during backward: scaled iff a scaler scaled the loss
        if not explicit:
            return "unknown"
        return "scaled" if scaler is not None else "unscaled"
    return None


def loss_scale(scaler: Any) -> float | None:
    """The scaler's current scale (``None`` without a scaler)."""
    return None if scaler is None else float(scaler.get_scale())


def scale_in_force(scaler: Any) -> torch.Tensor | float | None:
    """The scale that multiplies this iteration's loss, read without a host sync.

    Taken when the iteration begins (before ``scaler.update()`` changes it): a device copy of
    the scale tensor, the initial scale before the first ``scaler.scale``, ``1.0`` for a
    disabled scaler, ``None`` without a scaler. :func:`as_scale` turns it into a float.
    """
    if scaler is None:
        return None
    if hasattr(scaler, "is_enabled") and not scaler.is_enabled():
        return 1.0
    current = getattr(scaler, "_scale", None)
    if isinstance(current, torch.Tensor):
        return current.detach().clone()
    init = getattr(scaler, "_init_scale", None)
    return float(init) if init is not None else float(scaler.get_scale())


def as_scale(value: torch.Tensor | float | None) -> float | None:
    """A :func:`scale_in_force` value as a float (one host read at the step boundary)."""
    return None if value is None else float(value)


def update_marker(scaler: Any) -> Any:
    """An object that changes identity at every ``scaler.update()`` (its per-optimizer states).

    ``GradScaler.update`` replaces ``_per_optimizer_states`` with a fresh dict, so a changed
    marker means an iteration ended, even when ``GradScaler.step`` skipped ``optimizer.step``
    (and with it the optimizer's hooks) because of an inf/NaN gradient.
    """
    return getattr(scaler, "_per_optimizer_states", None)


# ------------------------------------------------------------------ (telemetry)
class TelemetryWindow:
    """Depth and timing of nested ``telemetry()`` windows of one collector.

    Parameters
    ----------
    charge
        Called with the seconds of each outermost window when it closes.
    """

    def __init__(self, charge: Callable[[float], None]) -> None:
        self._charge = charge
        self.depth = 0

    @property
    def open(self) -> bool:
        """Whether a window is open (the hooks must record nothing)."""
        return self.depth > 0

    @contextmanager
    def __call__(self) -> Iterator[None]:
        """Open a window; on exit (also by an exception) charge its seconds and close it."""
        t0 = time.perf_counter()
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                self._charge(time.perf_counter() - t0)


class OpenStep:
    """The step being recorded, as every hook of one collector sees it.

    The collector owns it and is the only one to begin or end a step (it sets :attr:`state`,
    :attr:`in_transaction` and :attr:`scaler`); the hooks read it and write what they observe
    into the :class:`StepState` it holds. A hook whose rule ends a step (an implicit optimizer
    step, a skipped scaler step) calls the ``end_step`` callback the collector handed it.
    """

    def __init__(self) -> None:
        self.state: StepState | None = None  #: ``None`` between steps (closed, or failed to begin)
        self.in_transaction = False  #: a ``with collector.step(...)`` block is open
        self.scaler: Any = None  #: the open transaction's ``GradScaler``
        self.window = TelemetryWindow(self.charge)  #: ``collector.telemetry()`` windows

    def recording(self) -> StepState | None:
        """The step the hooks record into, ``None`` when they must record nothing (no step, or a
        :meth:`~stepscope.HistoryCollector.telemetry` window is open)."""
        return None if self.window.depth else self.state

    def charge(self, seconds: float) -> None:
        """Telemetry seconds spent outside the hooks, charged to the open step (inside a
        telemetry window its own timer counts everything: no double charge)."""
        if self.state is not None and not self.window.depth:
            self.state.telemetry_s += seconds
