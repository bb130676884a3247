"""Offline curvature analysis: Fisher, GGN and Jacobian-Gram blocks, KFAC spectra, mismatch.

- :func:`analyze_curvature` (:mod:`stepscope.curvature.analyze`) defines every reported quantity.
- :func:`run_curvature_panel` (:mod:`stepscope.curvature.offline`) runs it over pinned checkpoints.
- :func:`directional`, :func:`top_eigenvalues`, :func:`trace`: matrix-free Hessian/GGN/Fisher
  vector-product probes (:mod:`~stepscope.curvature.quadratic`, :mod:`~stepscope.curvature.eigen`,
  :mod:`~stepscope.curvature.estimators`).
"""

from stepscope.curvature.analyze import analyze_curvature, probe_sha256
from stepscope.curvature.eigen import top_eigenvalues
from stepscope.curvature.estimators import trace
from stepscope.curvature.families import CurvatureFamily, CurvatureMode
from stepscope.curvature.offline import make_panel_pins, run_curvature_panel
from stepscope.curvature.quadratic import directional

__all__ = [
    "CurvatureFamily",
    "CurvatureMode",
    "analyze_curvature",
    "directional",
    "make_panel_pins",
    "probe_sha256",
    "run_curvature_panel",
    "top_eigenvalues",
    "trace",
]
