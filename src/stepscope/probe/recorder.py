"""Records returned by :meth:`DenseProbe.measure` and flat scalar rows (legacy names:
:mod:`stepscope.probe.legacy`).

A :class:`ProbeRecord` holds the step axes (``optimizer_step``, ``examples_seen``, ``epoch``), the
model-level probe outcome (cross-entropy, accuracy, predicted-class counts, confusion matrix) and
one :class:`LayerRecord` per measured affine module, keyed by its qualified name. Missing values
are ``None`` with the counts behind them in ``validity``; nothing missing is written as 0.

Example
-------
>>> axes = StepAxes(optimizer_step=10, examples_seen=640, epoch=0)
>>> axes.to_dict()
{'optimizer_step': 10, 'examples_seen': 640, 'epoch': 0}
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from stepscope.probe.legacy import OMITTED_LEGACY, legacy_names
from stepscope.probe.moments import MomentFields


@dataclass(frozen=True)
class StepAxes:
    """The training clocks a measurement belongs to (never interchangeable)."""

    optimizer_step: int
    examples_seen: int
    epoch: int

    def to_dict(self) -> dict[str, int]:
        """The three axes by name."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class ModelRecord:
    """Model-level probe outcome in eval mode.

    Attributes
    ----------
    loss
        Mean cross-entropy per scored target (nats per example for class labels, per token for
        sequences).
    accuracy_fraction
        Correct / scored targets, in [0, 1]; ``None`` when no target is scored (``n_targets``
        0: every label ``-100``), as ``loss``.
    predicted_counts
        Examples predicted per class (argmax; ties go to the lowest index, counted in
        ``argmax_tie_count``).
    confusion
        ``confusion[true][predicted]`` counts over scored targets; empty above the class cap.
    n_targets
        Scored targets: ``n_examples`` for class labels, the scored tokens for sequences (loss,
        accuracy and counts are per target).
    confusion_mode
        ``"dense"`` (``num_classes <= confusion_class_cap``) or ``"bounded"``: no ``C x C`` matrix,
        ``per_class_errors[c]`` (targets of class ``c`` predicted wrong) and
        ``top_confused_pairs`` (``[true, predicted, count]``, most frequent first) instead.
    logit_gradient_underflow_targets
        Scored targets whose label derivative ``-sum_{j != y} p_j`` is exactly 0 in the probe's
        dtype (every other probability underflowed; the true value never is 0): their gradient
        contributions are below what the dtype resolves (:mod:`stepscope.probe.crossentropy`).
    """

    loss: float | None
    accuracy_fraction: float | None
    n_examples: int
    n_correct: int
    num_classes: int
    predicted_counts: list[int]
    confusion: list[list[int]]
    argmax_tie_count: int
    n_targets: int | None = None
    confusion_mode: str = "dense"
    confusion_class_cap: int | None = None
    per_class_errors: list[int] | None = None
    top_confused_pairs: list[list[int]] | None = None
    logit_gradient_underflow_targets: int | None = None


@dataclass(frozen=True)
class BlockRecord(MomentFields):
    """Gradient moments and parameter distances of one parameter tensor (weight or bias).

    Gradient moments are defined in :mod:`stepscope.probe.moments`; distances in
    :mod:`stepscope.probe.state`. ``update_ratio = update / ||W_before||``.
    """

    param_l2: float
    displacement_from_init: float | None
    delta_since_snapshot: float | None
    delta_since_snapshot_start_step: int | None
    delta_since_snapshot_end_step: int | None
    delta_since_snapshot_interval_steps: int | None
    update: float | None
    update_ratio: float | None
    update_step: int | None
    validity: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        """Mapping-style access to a field (``record.layers['fc']['fisher_trace']``)."""
        if key not in self.keys():
            raise KeyError(key)
        return getattr(self, key)

    def keys(self) -> list[str]:
        """The field names."""
        return [f.name for f in dataclasses.fields(self)]


@dataclass(frozen=True)
class LayerRecord(BlockRecord):
    """One affine module: the weight block's fields, zero fractions, and the bias block.

    ``activation_zero_fraction`` is the fraction of exact zeros in the layer input ``A`` (before
    unfolding/padding); ``backprop_zero_fraction`` that of ``B``. Counts are in ``validity``.
    ``bias`` is ``None`` when the module has no bias.
    """

    kind: str = "linear"
    legacy_index: int = 0
    activation_zero_fraction: float | None = None
    backprop_zero_fraction: float | None = None
    bias: BlockRecord | None = None


@dataclass(frozen=True)
class ProbeRecord:
    """Everything one :meth:`DenseProbe.measure` call produced."""

    step: StepAxes
    model: ModelRecord
    layers: dict[str, LayerRecord]
    probe: dict[str, Any]
    conventions: dict[str, Any]
    cost: dict[str, Any]
    #: every parameter the probe does not measure: ``name -> {module_type, reason, detail}``
    #: (:func:`stepscope.probe.sequence.uncovered_parameters`)
    uncovered_parameters: dict[str, dict[str, str]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe nested dict (legacy-name map and omitted legacy names included)."""
        out = dataclasses.asdict(self)
        out["legacy_names"] = {
            k: {"legacy_name": v.name, "relation": v.relation}
            for k, v in legacy_names("probe").items()
        }
        out["omitted_legacy_names"] = list(OMITTED_LEGACY)
        return out

    def scalars(self) -> dict[str, float | None]:
        """Flat ``probe/<layer>/<key>`` -> value (``None`` kept) for every numeric field."""
        out: dict[str, float | None] = {
            "probe/model/loss": self.model.loss,
            "probe/model/accuracy_fraction": self.model.accuracy_fraction,
            "probe/model/argmax_tie_count": float(self.model.argmax_tie_count),
        }
        for name, layer in self.layers.items():
            _flatten(f"probe/{name}", dataclasses.asdict(layer), out)
        return out

    def to_rows(self) -> list[dict[str, Any]]:
        """One flat JSON-safe row per scalar, each carrying the three axes and the probe hash."""
        axes = self.step.to_dict()
        sha = self.probe.get("sha256")
        return [
            {"name": k, "value": v, **axes, "probe_sha256": sha} for k, v in self.scalars().items()
        ]


def _flatten(prefix: str, value: Any, out: dict[str, float | None]) -> None:
    if isinstance(value, dict):
        for key, sub in value.items():
            _flatten(f"{prefix}/{key}", sub, out)
    elif isinstance(value, bool):
        out[prefix] = float(value)
    elif isinstance(value, int | float):
        out[prefix] = float(value) if math.isfinite(value) else None
    elif value is None and not prefix.endswith("_reason"):
        out[prefix] = None
