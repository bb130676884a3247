"""Offline curvature analysis: Fisher, GGN and Jacobian-Gram blocks, KFAC spectra, mismatch.

See :func:`stepscope.curvature.analyze.analyze_curvature` for the definitions of every reported
quantity and :func:`stepscope.curvature.offline.run_curvature_panel` for checkpoint panels.
"""

from stepscope.curvature.analyze import analyze_curvature, probe_sha256
from stepscope.curvature.families import CurvatureMode, Family

__all__ = ["CurvatureMode", "Family", "analyze_curvature", "probe_sha256"]
