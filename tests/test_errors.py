"""The refusal vocabulary: one place, every code used in the source is declared there."""

import ast
import pickle
from pathlib import Path

import pytest

import stepscope
from stepscope.errors import CODES, Refusal

SRC = Path(stepscope.__file__).parent


def codes_used_in_source() -> set[tuple[str, str]]:
    used = set()
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Refusal"
            ):
                if (
                    node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                ):
                    used.add((node.args[0].value, f"{path.relative_to(SRC)}:{node.lineno}"))
    return used


def test_every_code_raised_in_the_package_is_declared():
    unknown = [(code, where) for code, where in codes_used_in_source() if code not in CODES]
    assert not unknown, f"undeclared refusal codes: {unknown}"


def test_codes_are_snake_case_with_meanings():
    for code, meaning in CODES.items():
        assert code.isidentifier() and code == code.lower(), code
        assert meaning.strip(), code


def test_refusal_carries_code_message_remedies_and_pickles():
    err = Refusal("selection_empty", "nothing matched", ["check names"])
    assert (err.code, err.message, err.remedies) == (
        "selection_empty",
        "nothing matched",
        ("check names",),
    )
    assert "selection_empty" in str(err) and "check names" in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert (again.code, again.remedies) == (err.code, err.remedies)


def test_unknown_code_is_a_programming_error():
    with pytest.raises(ValueError):
        Refusal("not_a_code", "x")


def test_require_extra_names_the_install_command():
    from stepscope.errors import require_extra

    with pytest.raises(Refusal) as err:
        require_extra("definitely_not_installed_pkg.sub", "report", "plotting")
    assert err.value.code == "extra_missing"
    assert any("pip install" in r for r in err.value.remedies)


def test_every_public_export_resolves():
    for name in stepscope.__all__:
        assert getattr(stepscope, name) is not None, name
