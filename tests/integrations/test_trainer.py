"""The framework-free driver (``TrainerWatch``) and the adapters' import contract."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

import stepscope as ss
from stepscope.integrations import trainer as trainer_module
from stepscope.integrations.trainer import TrainerWatch

ADAPTERS = {
    "stepscope.integrations.lightning": ("lightning.pytorch", "lightning"),
    "stepscope.integrations.transformers": ("transformers", "transformers"),
}


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_a_missing_framework_refuses_with_the_install_line(adapter, monkeypatch):
    framework, extra = ADAPTERS[adapter]
    for mod in [m for m in sys.modules if m == framework or m.startswith(framework + ".")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, framework, None)  # import of it raises ImportError
    monkeypatch.delitem(sys.modules, adapter, raising=False)
    with pytest.raises(ss.Refusal) as err:
        importlib.import_module(adapter)
    assert err.value.code == "extra_missing"
    assert f"pip install 'stepscope[{extra}]'" in err.value.remedies


def _train(watch: TrainerWatch, model, opt, steps: int, start: int = 0) -> None:
    for step in range(start, start + steps):
        watch.begin_step(opt, trainer_step=step, epoch=0)
        model(torch.randn(4, 3)).sum().backward()
        watch.micro_batch(4)
        opt.step()
        opt.zero_grad()
        watch.end_step(clipped=False)


def test_values_logged_for_a_written_step_survive_close(tmp_path):
    """A trainer logs step k's loss after step k ended; the last step's must not be lost."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = TrainerWatch(settings=ss.WatchSettings(durable=False))
    watch.start(model, default_dir=tmp_path, trainer_step=0, rank=0, announce=lambda s: None)
    _train(watch, model, opt, 3)
    for step in range(3):
        watch.log("train/loss", float(step) + 0.5, step=step)
    watch.close()
    loss = ss.open_run(tmp_path).scalars("train/loss")
    assert loss.steps.tolist() == [0, 1, 2]
    assert loss.values.tolist() == [0.5, 1.5, 2.5]


def _watch(root, step: int, model) -> TrainerWatch:
    s = TrainerWatch(settings=ss.WatchSettings(durable=False))
    s.start(model, default_dir=root, trainer_step=step, rank=0, announce=lambda _: None)
    return s


def test_resume_continues_at_the_checkpoint_step_earlier_or_later(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = _watch(tmp_path, 0, model)
    _train(first, model, opt, 5)  # steps 0..4; a checkpoint was saved after step 2
    first.close()
    rewound = _watch(tmp_path, 3, model)
    _train(rewound, model, opt, 1, start=3)
    rewound.close()
    reader = ss.open_run(tmp_path)
    assert reader.steps.tolist() == [0, 1, 2, 3]  # 3 and 4 of the first segment superseded
    assert [b.examples_seen for b in reader.step_blocks()] == [4, 8, 12, 16]
    later = _watch(tmp_path, 6, model)  # a checkpoint beyond the record: steps 4, 5 lost
    _train(later, model, opt, 1, start=6)
    later.close()
    reader = ss.open_run(tmp_path)
    assert reader.steps.tolist() == [0, 1, 2, 3, 6]
    assert [s.resumed_at_step for s in reader.segments] == [None, 3, 6]
    assert reader.step_blocks()[-1].examples_seen is None  # unknown across the gap, never guessed


def test_rank_zero_alone_announces_the_run_directory(tmp_path):
    said: list[str] = []
    for rank in (0, 1):
        s = TrainerWatch(settings=ss.WatchSettings(durable=False))
        s.start(
            torch.nn.Linear(3, 2),
            default_dir=tmp_path / str(rank),
            trainer_step=0,
            rank=rank,
            announce=said.append,
        )
        s.close()
    assert len(said) == 1 and str(tmp_path / "0") in said[0]


def test_shared_run_id_without_a_process_group_is_the_given_or_a_fresh_one():
    assert trainer_module.shared_run_id("abc") == "abc"
    a, b = trainer_module.shared_run_id(None), trainer_module.shared_run_id(None)
    assert a != b and len(a) == 12
