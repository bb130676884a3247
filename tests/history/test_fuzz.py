"""Seeded, bounded fuzzing of every file kind of the artifact and of ``evals.log``.

The engine is ``benchmarks/artifact_fuzz.py`` (the longer campaign runs it on thousands of
seeds; its counts are in docs/history.md). Each example mutates one file of a closed or a killed
base run and reads everything back: the outcome must be the base's data (a committed prefix for
the killed run), a coded ``Refusal``, a disclosed difference, or a re-signed (forged) artifact
read as its new content — never a raw exception, a read over 5 s, or a traced allocation above
64 MiB plus 8x the artifact's bytes.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.artifact_fuzz import FAILURES, Campaign


@pytest.fixture(scope="module")
def campaign(tmp_path_factory):
    return Campaign(tmp_path_factory.mktemp("fuzz"))


@settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 2**31 - 1))
def test_every_mutant_reads_correctly_or_refuses_with_a_code(campaign, seed):
    outcome, detail = campaign.run_one(seed)
    assert outcome not in FAILURES, f"seed {seed}: {outcome} {detail}"


def test_the_fuzzer_reaches_every_file_kind_and_both_outcomes(campaign):
    seen = {campaign.run_one(seed)[0] for seed in range(60)}
    assert {"same", "refused"} <= seen
    kinds = {"manifest.json", "catalog.json", "index.json", "index", "chunks", "evals.log"}
    assert kinds <= set(campaign.targets), campaign.targets
    assert len(campaign.codes) >= 4  # several distinct refusal codes were exercised


def test_every_resigned_self_contradictory_mutant_is_refused(campaign):
    """The forger's edits that checksums cannot see (every sha256 recomputed) but that make the
    index contradict itself or its chunks: each must be refused with a code, never read."""
    outcomes = []
    for seed in range(40):
        outcome, detail = campaign.run_one(10_000 + seed, contradiction=True)
        assert outcome in {"refused", "same"}, f"seed {10_000 + seed}: {outcome} {detail}"
        outcomes.append((detail.split()[1], outcome))
    ops = {name.split(":")[1].split("+")[0] for name, _ in outcomes}
    assert len(ops) >= 6, ops  # most kinds of contradiction were drawn
    assert [o for _, o in outcomes].count("refused") >= 30
