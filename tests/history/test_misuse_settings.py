"""Misuse that used to be accepted and break later, or raise raw: each refuses with a code at once.

Settings that an earlier version accepted and then failed on every step (``event_bus="x"``:
AttributeError each step; ``extra={"a": nan}``; ``output_keys="x"``; ``settings="x"``), statistics
decoded from a NaN spine row or reduced from sparse/nested tensors (raw ValueError/RuntimeError),
and export destinations of the wrong kind (raw NotADirectoryError/IsADirectoryError).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import stepscope as ss
from stepscope.cli import main
from stepscope.stats import SPINE_WIDTH, Histogram, RunningStats

SETTINGS = {
    "event_bus_str": dict(event_bus="x"),
    "event_bus_object": dict(event_bus=object()),
    "extra_nan": dict(extra={"a": math.nan}),
    "extra_nested_inf": dict(extra={"a": {"b": [1.0, math.inf]}}),
    "output_keys_str": dict(output_keys="x"),
}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_watch_settings_refuse_what_would_break_a_step_later(name):
    with pytest.raises((ss.Refusal, TypeError)) as err:
        ss.WatchSettings(in_memory=True, **SETTINGS[name])
    if isinstance(err.value, ss.Refusal):
        assert err.value.code == "settings_invalid"
    assert "WatchSettings" in str(err.value) or "must" in str(err.value)


def test_a_real_event_bus_and_finite_extra_are_accepted():
    s = ss.WatchSettings(in_memory=True, event_bus=ss.EventBus(), extra={"lr": 0.1})
    assert s.extra == {"lr": 0.1}


def test_settings_that_are_not_watch_settings_refuse():
    with pytest.raises(ss.Refusal) as err:
        ss.HistoryCollector(torch.nn.Linear(2, 2), settings="x")
    assert err.value.code == "settings_invalid" and "WatchSettings" in err.value.remedies[0]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 0.5])
def test_a_spine_row_with_impossible_counts_refuses(bad):
    v = np.asarray(RunningStats().to_vector(), dtype=np.float64).copy()
    assert v.shape == (SPINE_WIDTH,)
    v[0] = bad
    with pytest.raises(ss.Refusal) as err:
        RunningStats.from_vector(v)
    assert err.value.code == "stat_payload_invalid"


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.eye(3).to_sparse(),
        lambda: torch.eye(3).to_sparse_csr(),
        lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
    ],
    ids=["coo", "csr", "nested"],
)
def test_sparse_and_nested_tensors_refuse_with_what_to_reduce_instead(make):
    t = make()
    for stat in (RunningStats(), Histogram()):
        with pytest.raises(ss.Refusal) as err:
            stat.update(t)
        assert err.value.code == "stat_dtype_unsupported" and err.value.remedies


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export-dest")
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ss.HistoryCollector(model, settings=ss.WatchSettings(output_dir=root / "r")) as c:
        for _ in range(2):
            with c.step(opt, examples=1):
                model(torch.randn(1, 2)).sum().backward()
                opt.step()
                opt.zero_grad()
    return root / "r"


@pytest.mark.parametrize("flag", ["--tensorboard", "--parquet", "--wandb"])
def test_export_to_a_file_where_a_folder_goes_refuses(run_dir, tmp_path, flag, capsys):
    target = tmp_path / "a-file"
    target.write_text("keep me")
    assert main(["export", str(run_dir), flag, str(target)]) == 3
    assert "[export_destination_invalid]" in capsys.readouterr().err
    assert target.read_text() == "keep me"  # nothing lost


def test_export_jsonl_to_a_folder_refuses(run_dir, tmp_path, capsys):
    assert main(["export", str(run_dir), "--jsonl", str(tmp_path)]) == 3
    assert "[export_destination_invalid]" in capsys.readouterr().err


def test_merge_onto_a_file_refuses_with_a_code(run_dir, tmp_path, capsys):
    target = tmp_path / "a-file"
    target.write_text("keep me")
    assert main(["merge", str(run_dir), "--out", str(target)]) == 3
    assert "refused [" in capsys.readouterr().err and target.read_text() == "keep me"
