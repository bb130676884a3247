"""Reading one field of a decoded JSON record; a missing or mistyped field refuses.

The history records' ``from_dict`` readers (:mod:`stepscope.history.runrecord`,
:mod:`stepscope.history.schema`) share these: every malformed field refuses
``history_json_invalid`` naming the record and the field, never a ``KeyError``.

Example
-------
>>> from stepscope.history.fields import _need, _opt
>>> _need({"step": 3}, "step", int, "step block"), _opt({}, "epoch", int, "step block")
(3, None)
>>> from stepscope.errors import Refusal
>>> try:
...     _need({"step": True}, "step", int, "step block")
... except Refusal as refusal:
...     print(refusal.code)
history_json_invalid
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from stepscope.errors import Refusal


def _need(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(d, Mapping) or key not in d:
        raise Refusal(
            "history_json_invalid",
            f"{what} lacks the field {key!r}.",
            ["rewrite the record with this stepscope version", "check the file was not truncated"],
        )
    value = d[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        raise Refusal(
            "history_json_invalid",
            f"{what} field {key!r} has type {type(value).__name__}.",
            ["check the file was not edited or truncated"],
        )
    return value


def _finite(value: int | float, key: str, what: str) -> float:
    try:
        out = float(value)
    except OverflowError:
        out = math.inf
    if not math.isfinite(out):
        raise Refusal("history_json_invalid", f"{what} field {key!r} is not a finite number.", [])
    return out


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _opt(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if d.get(key) is None:
        return None
    return _need(d, key, kind, what)


def _mapping(d: Mapping[str, Any], key: str, what: str) -> dict[str, Any]:
    value = d.get(key, {})
    if not isinstance(value, Mapping):
        raise Refusal("history_json_invalid", f"{what} field {key!r} is not an object.", [])
    return dict(value)
