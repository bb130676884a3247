"""One set of file helpers (``stepscope.history.files``) serves history, runlog and curvature.

Oracles: ``hashlib`` over the bytes read back with plain ``open``, and ``json.loads`` with a
hook that rejects the non-standard constants.
"""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import torch

from stepscope.curvature import offline, pins
from stepscope.history import files


def _strict_json(path):
    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_curvature_uses_the_history_file_helpers():
    assert offline.atomic_write_json is files.atomic_write_json
    assert pins.sha256_file is files.sha256_file  # the panel's pins hash files with it


def test_panel_pins_hash_a_linked_checkpoint_by_its_content(tmp_path):
    real = tmp_path / "epoch1.pt"
    torch.save({"w": torch.arange(5.0)}, real)
    link = tmp_path / "latest.pt"
    link.symlink_to(real)
    source = tmp_path / "model.py"
    source.write_text("def factory():\n    pass\n")
    probe = (torch.zeros(2, 3), torch.tensor([0, 1]))
    pins = offline.make_panel_pins([source], {1: link, 2: real}, probe)
    want = hashlib.sha256(real.read_bytes()).hexdigest()
    assert pins["checkpoint_sha256"] == {"1": want, "2": want}
    assert pins["source_sha256"] == {str(source): hashlib.sha256(source.read_bytes()).hexdigest()}


def test_atomic_write_json_writes_standard_json_or_nothing(tmp_path):
    target = tmp_path / "x.json"
    files.atomic_write_json(target, {"a": [1, 0.5, None, "nan"]}, durable=False)
    assert _strict_json(target) == {"a": [1, 0.5, None, "nan"]}
    with pytest.raises(ValueError):
        files.atomic_write_json(target, {"a": math.nan}, durable=False)
    assert _strict_json(target) == {"a": [1, 0.5, None, "nan"]}  # the old content stays
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]  # no temporary file left
