"""Module selection by type name, full-name glob and predicate."""

import pytest
import torch

from stepscope import Refusal
from stepscope.selection import select_modules


def model():
    return torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(12)], torch.nn.ReLU())


def names(sel):
    return [n for n, _ in select_modules(model(), sel)]


def test_glob_matches_whole_names_only():
    assert names("1") == ["1"]
    assert names("1*") == ["1", "10", "11", "12"]
    assert names("1?") == ["10", "11", "12"]


def test_type_names_predicates_and_unions():
    assert names("ReLU") == ["12"]
    assert len(names("Linear")) == 12
    assert names(lambda n, m: n in {"3", "4"}) == ["3", "4"]
    assert names(["ReLU", "0"]) == ["0", "12"]


def test_root_is_not_selected_by_a_glob_but_by_its_type():
    assert "" not in names("*")
    assert [n for n, _ in select_modules(torch.nn.Linear(2, 2), "Linear")] == [""]


@pytest.mark.parametrize(
    "sel,code", [("Conv2d", "selection_empty"), ("", "selection_invalid"), (3, "selection_invalid")]
)
def test_refusals(sel, code):
    with pytest.raises(Refusal) as err:
        select_modules(model(), sel)
    assert err.value.code == code
