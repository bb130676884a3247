"""``stepscope.region``: the user's bracket, as a context manager and as a decorator.

Without an active :func:`stepscope.session` a region is inert: entering and leaving it reads one
slot and returns (see ``benchmarks/region_overhead.py`` for the cost in ns). Inside a session it
registers a ``user_region`` span (with an occurrence number and the id of the enclosing span) in
the session's :class:`~stepscope.profile.spans.SpanRegistry`, and opens a
``torch.profiler.record_function`` bracket labelled ``stepscope.region/<name>`` so the same
region is visible in the profiler's trace and its device time can be joined.

Example
-------
>>> import torch, stepscope as ss
>>> with ss.session() as s:
...     with ss.region("forward", batch=4):
...         _ = torch.ones(4) * 2
>>> [(sp.name, sp.metadata) for sp in s.result.spans if sp.altitude.value == "user_region"]
[('forward', {'batch': 4})]
>>> @ss.region("step")
... def step():
...     return 1
>>> step()  # inert: no session is active
1
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from stepscope.profile import compat
from stepscope.profile.accounting import REGION_PREFIX
from stepscope.profile.session import _ACTIVE
from stepscope.profile.spans import Altitude, OwnerClass, check_scalar_metadata, escape_name

F = TypeVar("F", bound=Callable[..., Any])


class region:  # lower-case: used like a function: ``with ss.region("fwd"):``
    """Bracket user code as a named region.

    Parameters
    ----------
    name
        A display name (escaped and bounded; identity is the span id, not the name).
    **scalar_metadata
        Scalars (bool, int, float, str, None) stored on the span; anything else refuses
        ``span_metadata_invalid``.

    Examples
    --------
    >>> import stepscope as ss
    >>> with ss.region("data"):  # inert outside a session
    ...     pass
    """

    __slots__ = ("_entered", "metadata", "name")

    def __init__(self, name: str, **scalar_metadata: Any) -> None:
        self.name = name
        self.metadata = check_scalar_metadata(scalar_metadata) if scalar_metadata else None
        self._entered: list[tuple[Any, Any, Any]] | None = None

    def __enter__(self) -> region:
        current = _ACTIVE[0]  # the slot itself: the inert path is one index and one compare
        if current is None:
            return self
        registry = current.registry
        span = registry.open(self.name, Altitude.USER_REGION, OwnerClass.USER, self.metadata)
        bracket = compat.record_function(REGION_PREFIX + escape_name(self.name)[0])
        try:
            bracket.__enter__()
        except BaseException:
            registry.close(span)
            raise
        if self._entered is None:
            self._entered = []
        self._entered.append((registry, span, bracket))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._entered:
            return
        registry, span, bracket = self._entered.pop()
        try:
            bracket.__exit__(exc_type, exc, tb)
        finally:
            registry.close(span)

    def __call__(self, func: F) -> F:
        """Use the region as a decorator: each call runs inside a fresh region."""
        name, metadata = self.name, self.metadata or {}

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _ACTIVE[0] is None:
                return func(*args, **kwargs)
            with region(name, **metadata):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
