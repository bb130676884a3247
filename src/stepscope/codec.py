"""Spellings of values at the edges: non-finite floats in JSON, closed vocabularies from strings.

JSON has no NaN or infinity, so every stepscope record writes a non-finite float as one of the
strings ``"nan"``, ``"inf"``, ``"-inf"`` (Python's ``repr``, which ``float()`` reads back) and a
finite float as a number: :func:`json_float` writes that spelling, :func:`float_from_json` reads
it (and nothing else). :func:`parse_enum` turns a user argument or a stored string into a member
of a closed vocabulary (an :class:`enum.Enum`) or refuses with the code the caller names (the
caller knows whether a bad value is a bad argument or a damaged file).

Example
-------
>>> json_float(float("-inf")), json_float(0.5), json_float(None)
('-inf', 0.5, None)
>>> float_from_json("nan", "loss")
nan
>>> import enum
>>> class Color(str, enum.Enum):
...     RED = "red"
>>> parse_enum(Color, "red", "color", "settings_invalid")
<Color.RED: 'red'>
>>> parse_enum(Color, "blue", "color", "settings_invalid")
Traceback (most recent call last):
...
stepscope.errors.RefusalInputError: [settings_invalid] color 'blue' is not one of: red. \
Remedies: use one of: red
"""

from __future__ import annotations

import enum
import math
from typing import TypeVar

from stepscope.errors import Code, Refusal

E = TypeVar("E", bound=enum.Enum)

#: The JSON spellings of the non-finite floats (``repr`` of each; ``float()`` reads them back).
NONFINITE_SPELLINGS: dict[str, float] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def json_float(value: float | None) -> float | str | None:
    """``value`` in its JSON spelling: a finite float as is, a non-finite one as a string.

    Parameters
    ----------
    value
        A float, or None (kept: missing is never zero).

    Returns
    -------
    float | str | None
        ``value`` unchanged when finite or None, else ``"nan"``, ``"inf"`` or ``"-inf"``.
    """
    if value is None or math.isfinite(value):
        return value
    return repr(float(value))


def float_from_json(
    value: object, what: str = "value", code: str | Code = Code.HISTORY_JSON_INVALID
) -> float | None:
    """Read back :func:`json_float`'s spelling: a number, one of the non-finite strings, or None.

    Parameters
    ----------
    value
        The decoded JSON value.
    what
        The field's name (used in the refusal message).
    code
        The refusal code for anything else (a bool, another string, a container); default
        ``history_json_invalid`` (a stored file is damaged).

    Returns
    -------
    float | None
        The float (ints widened), or None for None.
    """
    if value is None:
        return None
    if isinstance(value, str) and value in NONFINITE_SPELLINGS:
        return NONFINITE_SPELLINGS[value]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Refusal(code, f"field {what!r} must be a number, got {value!r}.", [])
    return float(value)


def parse_enum(kind: type[E], value: object, what: str, code: str | Code) -> E:
    """``value`` as a member of the closed vocabulary ``kind``, or refuse ``code``.

    Parameters
    ----------
    kind
        The enum class.
    value
        A member of ``kind`` (returned as is) or a member's value (e.g. its string).
    what
        What ``value`` is, for the message (``"ring policy"``, ``"curvature kind"``).
    code
        The refusal code when ``value`` is not in the vocabulary: the caller's, since a bad API
        argument (``settings_invalid``, ``curvature_mode_invalid``) and a damaged stored file
        (``history_json_invalid``) are different failures.

    Returns
    -------
    E
        The member.
    """
    if isinstance(value, kind):
        return value
    try:
        return kind(value)
    except (ValueError, TypeError):
        allowed = ", ".join(str(m.value) for m in kind)
        raise Refusal(
            code, f"{what} {value!r} is not one of: {allowed}.", [f"use one of: {allowed}"]
        ) from None
