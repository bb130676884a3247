"""The top-level ``stepscope`` names of the events package (module examples: tests/test_doctests.py)."""

import stepscope.events as package


def test_top_level_names_resolve_to_the_events_package():
    import stepscope as ss

    assert ss.EventBus is package.EventBus
    assert ss.ObserverEvent is package.ObserverEvent
