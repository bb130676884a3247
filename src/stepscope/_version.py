"""The package version, in the bottom layer so that any module can record it without importing
the package root (``stepscope/__init__.py`` re-exports it; keep it equal to ``pyproject.toml``)."""

__version__ = "0.1.0"
