"""`repro conform`: the mirror's control rules against the installed vLLM's own code. Under the stack
profile that claims the installed release every rule family runs at least 10,000 calls with no
unexplained difference; another profile (a negative control) and the builder's old staging limit
show differences, so the comparison can fail. Needs vLLM (`tox -e vllm033`, `tox -e vllm026`)."""
import json

import pytest

from repro.cli.app import main
from repro.knobs.stacks import stack
from repro.upstream import load as upstream
from repro.conform import builder as builder_family
from repro.conform.explain import EXPLAINED, ONLY_IN
from repro.conform.run import CLAIMS, Budget, conform

MISSING = upstream.why_not()
pytestmark = [pytest.mark.conformance, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]
FAMILIES = ("dispatch", "steps", "scheduler", "builder", "input batch")


@pytest.fixture(scope="module")
def up():
    return upstream.load()


def claiming(up) -> str:
    return next(s for s, v in CLAIMS.items() if v == up.version)


@pytest.fixture(scope="module")
def claimed(up, cache):
    """The default run (`repro conform`'s budget) of the profile that claims this release."""
    return conform(up, stack(claiming(up)), Budget(), seed=0, cache=cache)


def test_every_family_runs_10000_calls_under_the_claiming_profile_with_no_unexplained_difference(claimed):
    assert {f: claimed.calls(f) >= 10_000 for f in FAMILIES} == dict.fromkeys(FAMILIES, True), claimed.seconds
    firsts = [r.first.line() for r in claimed.results if r.first]
    assert claimed.differences == 0 and claimed.unwritten_replays == 0, firsts


# Deliberate differences the default inputs no longer reach: 0.26.0 counting a FULL step's padding as
# prefills needs a FULL dispatch of a batch with a prefill, which the drawn streams stopped making once
# they drew the scheduler's settings; its explanation stays, read from the source.
NOT_MET = {"padding counted as prefills"}


def test_each_deliberate_difference_of_this_release_is_met(claimed, up):
    seen = {k for r in claimed.results for k in r.explained}
    assert seen == {k for k in EXPLAINED if ONLY_IN.get(k, up.version) == up.version} - NOT_MET, seen


def test_a_profile_of_another_release_shows_differences(tmp_path, capsys, monkeypatch, cache, up):
    """The negative control, through the command: the other release's rules against this release's code
    differ where the two releases differ (0.26.0 classes a one-token first chunk as a decode, leaves a
    vacated block-table row as it was, and counts no zero-draft spec row), and it exits 1."""
    monkeypatch.setenv("REPRO_CACHE", str(cache or ""))
    other = next(s for s, v in CLAIMS.items() if v != up.version)
    out = tmp_path / "negative.json"
    assert main(["conform", "--stack", other, "--cases", "5", "--sequences", "10", "--json", str(out), "--quiet"]) == 1
    doc = json.loads(out.read_text())
    differing = {r["rule"] for r in doc["rules"] if r["differences"]}
    assert {"gdn builder", "input batch", "draft bookkeeping"} <= differing, differing
    assert doc["claimed"] != doc["vllm"] and "First differences:" in capsys.readouterr().out


def test_the_builders_old_staging_limit_is_a_difference(up, cache, monkeypatch):
    """Sized as the runner sized it before (max(max_num_seqs, largest size) rows, and that many rows
    times 1+K tokens), the mirror stages spec batches vLLM does not: the builder family says so."""
    monkeypatch.setattr(builder_family, "staging_rows", lambda seqs, sizes, k: max(seqs, max(sizes, default=1)))
    res = conform(up, stack(claiming(up)), Budget(cases=1, sequences=6), seed=0, cache=cache)
    r = next(r for r in res.results if r.rule == "gdn builder")
    assert r.unexplained and r.first.field.startswith(("buffer", "staged")), r.first.line()


def test_the_command_prints_the_table_and_writes_the_json(tmp_path, capsys, monkeypatch, cache, up):
    monkeypatch.setenv("REPRO_CACHE", str(cache or ""))
    out = tmp_path / "c.json"
    assert main(["conform", "--cases", "3", "--sequences", "1", "--json", str(out), "--quiet"]) == 0
    table = capsys.readouterr().out
    assert f"vLLM {up.version} against the mirror under stack `{claiming(up)}` (it claims {up.version})" in table
    doc = json.loads(out.read_text())
    assert doc["differences"] == 0 and doc["command"] == f"repro conform --cases 3 --sequences 1 --json {out} --quiet"
    assert {r["family"] for r in doc["rules"]} == set(FAMILIES) and doc["vllm"] == up.version
