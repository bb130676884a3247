"""The fixed dense probe (docs/probe.md): per-example gradient moments, zero fractions, deltas, confusion.

Example
-------
>>> import stepscope as ss
>>> ss.DenseProbe is DenseProbe
True
"""

from stepscope.probe.cadence import (
    CadenceDecision,
    ProbeTimings,
    choose_cadence,
    choose_probe_size,
    plan_cadence,
    time_probe,
    time_probe_parts,
)
from stepscope.probe.dense import DenseProbe
from stepscope.probe.legacy import LEGACY_NAMES, OMITTED_LEGACY, LegacyName, legacy_names
from stepscope.probe.recorder import (
    BlockRecord,
    LayerRecord,
    ModelRecord,
    ProbeRecord,
    StepAxes,
)
from stepscope.probe.selection import ProbeSelection, probe_hash, select_probe
from stepscope.probe.sink import (
    probe_events,
    probe_identity,
    probe_scalar_rows,
    read_probe_axes,
    read_probe_confusion,
    read_probe_identity,
    write_probe_record,
)
from stepscope.probe.state import ParamSnapshot, StepUpdate

__all__ = [
    "LEGACY_NAMES",
    "OMITTED_LEGACY",
    "BlockRecord",
    "CadenceDecision",
    "DenseProbe",
    "LayerRecord",
    "LegacyName",
    "ModelRecord",
    "ParamSnapshot",
    "ProbeRecord",
    "ProbeSelection",
    "ProbeTimings",
    "StepAxes",
    "StepUpdate",
    "choose_cadence",
    "choose_probe_size",
    "legacy_names",
    "plan_cadence",
    "probe_events",
    "probe_hash",
    "probe_identity",
    "probe_scalar_rows",
    "read_probe_axes",
    "read_probe_confusion",
    "read_probe_identity",
    "select_probe",
    "time_probe",
    "time_probe_parts",
    "write_probe_record",
]
