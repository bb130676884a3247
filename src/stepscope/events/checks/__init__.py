"""Checks built only on events: non-finite values, zero fractions, gradient norms, update ratios."""

from stepscope.events.checks.base import Check, CheckAction, CheckWarning, Finding
from stepscope.events.checks.builtin import (
    GradientNormCheck,
    NonFiniteCheck,
    UpdateRatioCheck,
    ZeroFractionCheck,
)

__all__ = [
    "Check",
    "CheckAction",
    "CheckWarning",
    "Finding",
    "GradientNormCheck",
    "NonFiniteCheck",
    "UpdateRatioCheck",
    "ZeroFractionCheck",
]
