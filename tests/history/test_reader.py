import hashlib
import json
import shutil

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepscope import Refusal, open_run
from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
from stepscope.history.files import encode_log_row, log_extent
from stepscope.stats import Histogram


def _run(path, hx):
    with HistoryWriter(path, commit_steps=2, commit_seconds=None) as w:
        ids = [w.register_site(f"s{i}", "torch.nn.Linear", "f32[7]") for i in range(2)]
        for step in range(4):
            h = Histogram()
            h.update(torch.arange(-3.0, 4.0))
            b = ObservationBatch.observed(
                "activation",
                "forward",
                ids,
                hx.step_spines(step, 2),
                hist_rows=[0],
                histograms=h.to_vector()[None],
            )
            w.write_step(StepBlockRecord(step), [b], scalars={"loss": float(step)})
    return path


def _read_everything(h):
    assert h.steps.ndim == 1
    h.step_blocks()
    for site in h.sites:
        h.series(site, "activation", "mean")
        h.histograms(site, "activation")
    h.scalars("loss")
    h.observations()
    return h.verify()


def _chunk(h, table):
    return next(f["name"] for r in h.commits for f in r["files"] if f["table"] == table)


@pytest.mark.parametrize("table", ["steps", "observations", "histograms", "scalars"])
def test_one_flipped_byte_in_a_committed_chunk_refuses_corrupt(run_dir, hx, table):
    h = open_run(_run(run_dir, hx))
    name = _chunk(h, table)
    path = run_dir / "chunks" / name
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))
    h = open_run(run_dir)
    with pytest.raises(Refusal) as err:
        _read_everything(h)
    assert err.value.code == "history_artifact_corrupt"
    assert name in err.value.message and err.value.remedies
    report = open_run(run_dir).verify()
    assert not report.ok and [f[0] for f in report.failures] == [name]


@pytest.mark.parametrize("file", ["manifest.json", "catalog.json", "index.json"])
@pytest.mark.parametrize("damage", ["truncate", "garbage", "not_object", "empty"])
def test_malformed_or_truncated_json_refuses_json_invalid(run_dir, hx, file, damage):
    _run(run_dir, hx)
    path = run_dir / file
    raw = path.read_bytes()
    path.write_bytes(
        {
            "truncate": raw[: len(raw) // 2],
            "garbage": b"\xff\xfe{{",
            "not_object": b"[1, 2]",
            "empty": b"",
        }[damage]
    )
    with pytest.raises(Refusal) as err:
        _read_everything(open_run(run_dir))
    # a closed run's index.json carries the manifest's and catalog's sha256: they fail it first
    signed = file in ("manifest.json", "catalog.json")
    assert err.value.code == ("history_artifact_corrupt" if signed else "history_json_invalid")
    if signed:  # a forger who also re-signs the index meets the JSON check
        _resign_index(run_dir)
        with pytest.raises(Refusal) as err:
            _read_everything(open_run(run_dir))
        assert err.value.code == "history_json_invalid"


def _resign_index(run_dir, mutate=None):
    """Rewrite index.json (optionally mutated) with a matching manifest hash and self-hash."""
    from stepscope.history.files import json_sha256

    index = json.loads((run_dir / "index.json").read_text())
    index.pop("sha256")
    if mutate is not None:
        mutate(index)
    index["manifest_sha256"] = hashlib.sha256((run_dir / "manifest.json").read_bytes()).hexdigest()
    index["catalog_sha256"] = hashlib.sha256((run_dir / "catalog.json").read_bytes()).hexdigest()
    index["sha256"] = json_sha256(index)
    (run_dir / "index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("file", ["manifest.json", "catalog.json", "index.json"])
def test_missing_json_file_refuses_missing(run_dir, hx, file):
    _run(run_dir, hx)
    (run_dir / file).unlink()
    with pytest.raises(Refusal) as err:
        open_run(run_dir)
    assert err.value.code == "history_artifact_missing"


def _rewrite_log(run_dir, mutate):
    log = next((run_dir / "index").glob("*.log"))
    rows = [json.loads(line.split(b" ", 1)[1]) for line in log.read_bytes().splitlines()]
    mutate(rows)
    log.write_bytes(b"".join(encode_log_row(r) for r in rows))  # valid checksums
    seal = log_extent(log)  # and a matching seal: a forger's edit, not damage
    _resign_index(run_dir, lambda index: index["sealed"].update({f"index/{log.name}": seal}))


@pytest.mark.parametrize("bad", ["../escape.npy", "sub/dir.npy", "/etc/passwd", "..", "a\\b.npy"])
def test_chunk_names_with_separators_or_dotdot_refuse(run_dir, hx, bad):
    _run(run_dir, hx)

    def mutate(rows):
        rows[0]["files"][0]["name"] = bad

    _rewrite_log(run_dir, mutate)
    with pytest.raises(Refusal) as err:
        open_run(run_dir)
    assert err.value.code == "history_chunk_name_invalid"


def test_log_names_outside_index_dir_refuse(run_dir, hx):
    _run(run_dir, hx)
    _resign_index(run_dir, lambda index: index.update(logs=["index/../manifest.json"]))
    with pytest.raises(Refusal) as err:
        open_run(run_dir)
    assert err.value.code == "history_chunk_name_invalid"


def test_index_pointing_at_missing_chunk_refuses_missing(run_dir, hx):
    h = open_run(_run(run_dir, hx))
    name = _chunk(h, "observations")
    (run_dir / "chunks" / name).unlink()
    with pytest.raises(Refusal) as err:
        _read_everything(open_run(run_dir))
    assert err.value.code == "history_artifact_missing" and name in err.value.message
    failures = open_run(run_dir).verify().failures
    assert [(n, code) for n, code, _ in failures] == [(name, "history_artifact_missing")]
    assert "does not exist" in failures[0][2] and "steps 0..1 unaccounted for" in failures[0][2]


def test_chunk_that_is_not_npy_but_matches_its_hash_refuses_corrupt(run_dir, hx):
    import hashlib

    h = open_run(_run(run_dir, hx))
    name = _chunk(h, "observations")
    junk = b"not an npy file"
    (run_dir / "chunks" / name).write_bytes(junk)

    def mutate(rows):
        for r in rows:
            for f in r["files"]:
                if f["name"] == name:
                    f["sha256"] = hashlib.sha256(junk).hexdigest()

    _rewrite_log(run_dir, mutate)
    with pytest.raises(Refusal) as err:
        _read_everything(open_run(run_dir))
    assert err.value.code == "history_artifact_corrupt"


def test_pickled_object_chunk_is_never_unpickled(run_dir, hx):
    import hashlib
    import io

    h = open_run(_run(run_dir, hx))
    name = _chunk(h, "observations")
    buf = io.BytesIO()
    np.save(buf, np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    (run_dir / "chunks" / name).write_bytes(buf.getvalue())

    def mutate(rows):
        for r in rows:
            for f in r["files"]:
                if f["name"] == name:
                    f["sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()

    _rewrite_log(run_dir, mutate)
    with pytest.raises(Refusal) as err:
        _read_everything(open_run(run_dir))
    assert err.value.code == "history_artifact_corrupt"


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _mutate(obj, data):
    """Replace, drop or retype one node of a JSON tree chosen by hypothesis."""
    if isinstance(obj, (dict, list)) and obj and data.draw(st.booleans()):
        keys = list(obj.keys()) if isinstance(obj, dict) else list(range(len(obj)))
        key = data.draw(st.sampled_from(keys))
        action = data.draw(st.sampled_from(["descend", "replace", "drop"]))
        if action == "descend":
            obj[key] = _mutate(obj[key], data)
        elif action == "replace":
            obj[key] = data.draw(_json)
        else:
            del obj[key]
        return obj
    return data.draw(_json)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    import types

    from stepscope.history.batch import code_of  # noqa: F401  (keeps import errors visible)

    path = tmp_path_factory.mktemp("fuzz") / "run"
    rng = np.random.default_rng(0)

    def spines(step, n):
        return np.stack([[7, 7, 0, 3, 0, 0, 0, -1, 1, 1, 0.5, 3, 3, 0.07, 2]] * n) + rng.random()

    _run(path, types.SimpleNamespace(step_spines=spines))
    return path


@pytest.mark.parametrize("file", ["manifest.json", "catalog.json", "index.json", "index log"])
@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_fuzzed_json_files_only_ever_raise_refusal(pristine, tmp_path, file, data):
    run = tmp_path / "run"
    if not run.exists():
        shutil.copytree(pristine, run)
    if file == "index log":  # rows re-encoded with valid checksums: validation must hold
        file = "index/" + next((pristine / "index").glob("*.log")).name
        original = (pristine / file).read_bytes()
        rows = [json.loads(line.split(b" ", 1)[1]) for line in original.splitlines()]
        mutated = _mutate(rows, data)
        rows = mutated if isinstance(mutated, list) else [mutated]
        text = b"".join(encode_log_row(r) for r in rows)
    else:
        original = (pristine / file).read_bytes()
        tree = json.loads(original)
    if file.startswith("index/"):
        pass
    elif data.draw(st.booleans()):
        text = json.dumps(_mutate(tree, data)).encode()
    else:  # byte-level damage
        cut = data.draw(st.integers(0, len(original)))
        text = original[:cut] + data.draw(st.binary(max_size=6))
    (run / file).write_bytes(text)
    try:
        _read_everything(open_run(run))
    except Refusal:
        pass
    finally:
        (run / file).write_bytes(original)


def test_valid_npy_of_the_wrong_dtype_refuses_corrupt(run_dir, hx):
    import hashlib
    import io

    h = open_run(_run(run_dir, hx))
    name = _chunk(h, "observations")
    buf = io.BytesIO()
    np.save(buf, np.zeros(4), allow_pickle=False)
    (run_dir / "chunks" / name).write_bytes(buf.getvalue())

    def mutate(rows):
        for r in rows:
            for f in r["files"]:
                if f["name"] == name:
                    f["sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()

    _rewrite_log(run_dir, mutate)
    with pytest.raises(Refusal) as err:
        _read_everything(open_run(run_dir))
    assert err.value.code == "history_artifact_corrupt" and "dtype" in err.value.message


def test_in_place_chunk_view_matches_numpys_own_parser(run_dir, hx):
    import io

    from stepscope.history.layout import histogram_dtype, npy_load

    h = open_run(_run(run_dir, hx))
    for r in h.commits:
        for f in r["files"]:
            data = (run_dir / "chunks" / f["name"]).read_bytes()
            dtype = h._dtypes[f["table"]]
            if f["table"] == "histograms":
                assert f["counts_dtype"] == "|u1"  # counts of 7 values: narrowest exact dtype
                dtype = histogram_dtype(h.descriptor.width, f["counts_dtype"])
            ours = npy_load(data, f["name"], dtype)
            ref = np.load(io.BytesIO(data), allow_pickle=False)
            assert ours.dtype == ref.dtype and ours.tobytes() == ref.tobytes()


def test_tables_a_newer_writer_adds_are_skipped_and_listed(run_dir, hx):
    import hashlib
    import io

    _run(run_dir, hx)
    buf = io.BytesIO()
    np.save(buf, np.arange(3), allow_pickle=False)
    (run_dir / "chunks" / "future-evals.npy").write_bytes(buf.getvalue())

    def mutate(rows):
        rows[0]["files"].append(
            {
                "name": "future-evals.npy",
                "table": "evals",
                "stream": None,
                "rows": 3,
                "bytes": len(buf.getvalue()),
                "sha256": hashlib.sha256(buf.getvalue()).hexdigest(),
            }
        )

    _rewrite_log(run_dir, mutate)
    h = open_run(run_dir)
    assert h.unknown_tables == {"evals"}
    assert _read_everything(h).ok  # known tables read as before; verify covers the new chunk
