"""The refusal vocabulary: one place, every code used in the source is declared there."""

import ast
import pickle
from pathlib import Path

import pytest

import stepscope
from stepscope.errors import (
    CODES,
    Code,
    Family,
    Refusal,
    RefusalInputError,
    RefusalStorageError,
)

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
    with pytest.raises(ValueError) as err:
        Refusal("not_a_code", "x")
    assert not isinstance(err.value, Refusal)  # a bug in stepscope, not a user-facing refusal


def codes_raised_in_source() -> set[str]:
    """Codes the package can raise: a literal first argument of ``Refusal(...)`` or of a Refusal
    subclass's ``super().__init__(...)``, a ``code=`` keyword, or the default of a ``code``
    parameter of a helper that raises it."""
    raised = {code for code, _ in codes_used_in_source()}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call):
                if getattr(node.func, "attr", None) == "__init__" and node.args:
                    first = node.args[0]
                    if isinstance(first, ast.Constant) and first.value in CODES:
                        raised.add(first.value)
                for kw in node.keywords:
                    if kw.arg == "code" and isinstance(kw.value, ast.Constant):
                        raised.add(kw.value.value)
            elif isinstance(node, ast.FunctionDef):
                args = [*node.args.posonlyargs, *node.args.args]
                pairs = [
                    *zip(args[len(args) - len(node.args.defaults) :], node.args.defaults),
                    *zip(node.args.kwonlyargs, node.args.kw_defaults),
                ]
                for arg, default in pairs:
                    if arg.arg == "code" and isinstance(default, ast.Constant):
                        raised.add(default.value)
    return raised


def test_every_declared_code_is_raised_somewhere():
    assert set(CODES) - codes_raised_in_source() == set()


def test_the_enum_is_the_table_and_codes_is_its_string_view():
    assert CODES == {code.value: code.description for code in Code}
    for code in Code:
        assert code.name == code.value.upper()
        assert Code(code.value) is code and code == code.value and str(code) == code.value
        assert code.remedy is None or code.remedy.strip()


FAMILY_CLASS = {
    Family.INPUT: (RefusalInputError, ValueError),
    Family.STORAGE: (RefusalStorageError, OSError),
    Family.STATE: (Refusal, None),
}


def test_every_code_belongs_to_exactly_one_family():
    for code in Code:
        assert isinstance(code.family, Family), code
    by_family = {family: {c for c in Code if c.family is family} for family in Family}
    assert sum(len(codes) for codes in by_family.values()) == len(Code)
    assert all(by_family.values()), "a family without codes"
    # spot checks against the meaning of each family
    assert Code.HISTORY_DISK_FAULT in by_family[Family.STORAGE]
    assert Code.HISTORY_ARTIFACT_CORRUPT in by_family[Family.STORAGE]
    assert Code.HISTORY_FILE_KIND_INVALID in by_family[Family.STORAGE]
    assert Code.SELECTION_EMPTY in by_family[Family.INPUT]
    assert Code.COLLECTOR_CLOSED in by_family[Family.STATE]


@pytest.mark.parametrize("code", list(Code), ids=lambda c: c.value)
def test_a_plain_refusal_is_its_familys_class_and_pickles(code):
    cls, builtin = FAMILY_CLASS[code.family]
    err = Refusal(code.value, "what happened", ["do this"])
    assert type(err) is cls and isinstance(err, Refusal)
    assert builtin is None or isinstance(err, builtin)
    if code.family is Family.STATE:
        assert not isinstance(err, (ValueError, OSError))
    assert type(err.code) is str and err.code == code.value
    assert str(err) == f"[{code.value}] what happened Remedies: do this"
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is type(err)
    assert (again.code, again.message, again.remedies, str(again)) == (
        err.code,
        err.message,
        err.remedies,
        str(err),
    )


def test_ordinary_except_clauses_catch_refusals():
    with pytest.raises(ValueError):
        raise Refusal("selection_empty", "nothing matched")
    with pytest.raises(OSError) as err:
        raise Refusal(Code.HISTORY_DISK_FAULT, "disk full")
    assert err.value.code == "history_disk_fault" and err.value.errno is None
    assert err.value.strerror == "disk full"
    with pytest.raises(Refusal):
        raise Refusal("history_artifact_corrupt", "bad checksum")


def test_an_enum_member_is_accepted_and_the_default_remedy_fills_in():
    err = Refusal(Code.HISTORY_WRITER_ACTIVE, "locked")
    assert err.code == "history_writer_active" and type(err.code) is str
    assert err.remedies == (Code.HISTORY_WRITER_ACTIVE.remedy,)
    assert Refusal("history_writer_active", "locked", ["mine"]).remedies == ("mine",)
    assert Refusal("selection_invalid", "x").remedies == ()  # no obvious default


def test_a_refusal_subclass_keeps_its_own_class():
    from stepscope.events import CheckFailed

    err = CheckFailed("loss is nan", remedies=["lower the learning rate"])
    assert type(err) is CheckFailed and err.code == "check_failed"


def test_reading_a_damaged_artifact_keeps_the_storage_code(tmp_path):
    """An ``except OSError`` around file reads must not re-label an OSError-like refusal."""
    from stepscope.history.files import read_regular

    path = tmp_path / "chunk.bin"
    path.write_bytes(b"x" * 10)
    with pytest.raises(RefusalStorageError) as err:
        read_regular(path, "chunk", max_bytes=4)
    assert err.value.code == "history_artifact_corrupt"


def test_require_extra_names_the_install_command():
    from stepscope.errors import require_extra

    with pytest.raises(Refusal) as err:
        require_extra("definitely_not_installed_pkg.sub", "report", "plotting")
    assert err.value.code == "extra_missing"
    assert any("pip install" in r for r in err.value.remedies)


def test_every_public_export_resolves():
    for name in stepscope.__all__:
        assert getattr(stepscope, name) is not None, name
