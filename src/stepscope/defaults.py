"""Defaults shared by several layers, defined once at the bottom so every layer can import them.

:data:`DEFAULT_SEED` is the one default seed of stepscope: the dense probe's example selection,
the update channel's sampled indices, the curvature estimators' Rademacher draws (Python API,
offline panel and ``stepscope curvature`` command line alike) and the demo's train/validation
split all start from it unless the caller passes a seed. A run that keeps every default is
therefore reproducible from this one number.

Example
-------
>>> from stepscope.defaults import DEFAULT_SEED
>>> DEFAULT_SEED
20260909
"""

from __future__ import annotations

#: The default seed of every seeded choice in stepscope (see the module docstring).
DEFAULT_SEED: int = 20260909
