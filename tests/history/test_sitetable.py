"""The site table shared by the artifact writer and the RAM-only collector catalog."""

import pytest

from stepscope.collect.sites import SiteCatalog
from stepscope.history import HistoryWriter


@pytest.fixture(params=["ram", "writer"])
def table(request, tmp_path):
    if request.param == "ram":
        yield SiteCatalog()
        return
    w = HistoryWriter(tmp_path / "run")
    yield w
    w.close()


def test_topology_drift_ends_the_old_series_at_the_step_and_binds_a_new_one(table):
    a = table.register_site("fc", "Linear", "f32[4,3]", step=0)
    assert table.register_site("fc", "Linear", "f32[4,3]", step=3) == a  # same structure
    b = table.register_site("fc", "Linear", "f32[8,3]", step=7)
    assert b != a
    assert (table.sites[a].ended_step, table.sites[a].ended_reason) == (7, "topology_drift")
    assert table.sites[b].ended_step is None


def test_ending_an_older_series_does_not_unbind_the_names_current_one(table):
    a = table.register_site("fc", "Linear", "f32[4,3]", step=0)
    old = table.sites[a]
    copy = table.add_site_record(old)  # e.g. a merge copying a series that is still open
    table.end_site(a, 5, "module_removed")
    # the name still resolves to its current (newest) series: no new series is started
    assert table.register_site("fc", "Linear", "f32[4,3]", step=6) == copy
