"""The reference study used by ``stepscope demo``: bundled digits and a Ciresan-style MLP."""

from stepscope.demo.data import DigitSplits, load_digits_splits
from stepscope.demo.model import CIRESAN_WIDTHS, ciresan_mlp

__all__ = ["CIRESAN_WIDTHS", "DigitSplits", "ciresan_mlp", "load_digits_splits"]
