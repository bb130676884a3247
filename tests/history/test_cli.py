import os
import subprocess
import sys

from stepscope import open_run
from stepscope.cli import main
from stepscope.history import RunRecord


def test_show_prints_run_sites_streams_steps_and_sizes(run_dir, hx, capsys):
    hx.write_simple_run(run_dir, n_steps=5, n_sites=2, run=RunRecord.new(run_id="demo-run"))
    assert main(["show", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "run demo-run" in out
    assert "5 committed (0..4)" in out
    assert "s0" in out and "s1" in out and "torch.nn.Linear" in out
    assert "activation  10" in out  # 5 steps x 2 sites
    assert "sizes:" in out


def test_verify_exits_zero_only_when_every_checksum_holds(run_dir, hx, capsys):
    hx.write_simple_run(run_dir, n_steps=4)
    assert main(["verify", str(run_dir)]) == 0
    assert capsys.readouterr().out.startswith("ok:")
    name = open_run(run_dir).commits[-1]["files"][-1]["name"]
    path = run_dir / "chunks" / name
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x10
    path.write_bytes(bytes(raw))
    assert main(["verify", str(run_dir)]) == 1
    assert f"FAIL {name}" in capsys.readouterr().out


def test_verify_of_a_non_artifact_is_a_refusal_exit(tmp_path, capsys):
    assert main(["verify", str(tmp_path)]) == 3
    assert "history_artifact_missing" in capsys.readouterr().err


def test_merge_command_writes_a_merged_artifact(tmp_path, hx):
    paths = []
    for rank in range(2):
        paths.append(tmp_path / f"r{rank}")
        hx.write_simple_run(paths[-1], run=RunRecord.new(run_id="x", rank=rank, world_size=2))
    out = tmp_path / "merged"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-m", "stepscope", "merge", *map(str, paths), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    merged = open_run(out)
    totals = merged.series("s0", "activation", "total").values
    single = open_run(paths[0]).series("s0", "activation", "total").values
    assert (totals == 2 * single).all()


def test_show_json_prints_the_same_facts_as_one_object(run_dir, hx, capsys):
    import json

    hx.write_simple_run(run_dir, n_steps=5, n_sites=2, run=RunRecord.new(run_id="demo-run"))
    assert main(["show", str(run_dir), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    h = open_run(run_dir)
    assert payload["run"] == json.loads(json.dumps(h.run.to_dict()))
    assert payload["steps"] == {"committed": 5, "first": 0, "last": 4}
    assert [s["name"] for s in payload["sites"]] == [s.name for s in h.sites]
    assert payload["streams"]["activation"]["rows"] == 10  # 5 steps x 2 sites
    assert payload["sizes"] == {k: int(v) for k, v in h.sizes().items()}
    assert main(["show", str(run_dir)]) == 0  # the text view reads the same payload
    assert "activation  10" in capsys.readouterr().out
