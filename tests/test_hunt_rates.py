"""`repro bench --hunt-rates`: every bug of the public record hunted told (--hazard, fixed stack)
and blind (no hazard, the stack profile that carries its rule), seconds to the first failing
sequence and to the minimal one, a table and a `hunt_rates` JSON section. Bounded to a few
sequences a hunt, and the blind hunts to one profile (`--stack`), so the run stays near a minute
on the CPU tiny checkpoint."""
import json

import pytest

from kernels import registry
from repro.commands.hunt_rates import blind_stack, skip_reason
from repro.cli.app import main
from repro.knobs.hazards import HAZARDS

RECORD = [h for h in HAZARDS.values() if h.record]


def test_the_blind_stack_is_the_profile_that_departs_in_the_hazards_rule():
    assert blind_stack(HAZARDS["shape-only-uniform-decode"])[0] == "vllm-0.33-mrv1"
    assert blind_stack(HAZARDS["first-chunk-as-decode"])[0] == "vllm-0.26"
    assert blind_stack(HAZARDS["shape-only-uniform-decode"], "vllm-0.26")[0] == "vllm-0.26"
    stack, why = blind_stack(HAZARDS["fresh-alloc-split-op"])
    assert stack is None and "no stack profile sets it" in why
    stack, why = blind_stack(HAZARDS["first-chunk-as-decode"], "vllm-0.33-mrv1")
    assert stack is None and "vllm-0.33-mrv1" in why


def test_a_hazard_the_fused_gdn_core_refuses_is_skipped_with_its_reason():
    h = HAZARDS["pad-sentinel-mismatch"]
    assert skip_reason(h, streams=False) is None
    with registry.using(gdn="xpu_semantics"):
        assert "ssm_state[-1]" in skip_reason(h, streams=False)
        assert skip_reason(HAZARDS["stale-pad"], streams=False) is None


@pytest.mark.slow  # seven bounded hunts (one blind: --stack): under a minute on two idle CPU cores
def test_hunt_rates_time_each_record_bug_told_and_blind(tiny_path, tmp_path, capsys):
    out = tmp_path / "hr.json"
    rc = main(["bench", "--model", tiny_path, "--device", "cpu", "--island", "chain", "--batches", "1", "--iters", "1",
               "--warmup", "0", "--no-tiny-rates", "--no-repairs", "--quiet", "--hunt-rates", "--hunt-examples", "4",
               "--stack", "vllm-0.33-mrv1", "--json", str(out)])
    assert rc == 0
    table = capsys.readouterr().out
    assert "hunt rates" in table and "shape-only-uniform-decode" in table
    doc = json.loads(out.read_text())
    rates = doc["hunt_rates"]
    assert set(rates) == {h.name for h in RECORD}
    for h in RECORD:
        r = rates[h.name]
        assert r["told"]["found"], (h.name, r)  # planted and asked for: found within 4 sequences
        t = r["told"]
        assert 0 <= t["first_s"] <= t["minimal_s"] and 1 <= t["examples"] <= 4
        assert t["minimal_steps"] == len(t["minimal_sequence"]["steps"])
        assert t["first_divergence"]["line"]
        if not h.rules:
            assert r["blind"] is None and "no stack profile sets it" in r["blind_why"]
        elif h.name != "shape-only-uniform-decode":  # --stack: the blind hunts search that profile only
            assert r["blind"] is None and "vllm-0.33-mrv1" in r["blind_why"]
    b = rates["shape-only-uniform-decode"]["blind"]
    assert b["stack"] == "vllm-0.33-mrv1" and b["found"] and "uniform_decode" in b["rule"]
    assert "vLLM #53051" in b["upstream"] and b["minimal_s"] <= b["blame_s"]
    assert rates["shape-only-uniform-decode"]["told"]["first_divergence"]["tensor"]
    assert doc["hunt_rates_bound"] == {"examples": 4, "profile": "ci"}
    assert "--hunt-rates" in doc["command"]


@pytest.mark.parametrize("flag", [["--stack", "vllm-0.26"], ["--spec-tokens", "2"]])
def test_stack_and_k_without_hunt_rates_are_refused(flag, capsys):
    assert main(["bench", "--device", "cpu", *flag]) == 2
    err = capsys.readouterr().err
    assert flag[0] in err and len(err.strip().splitlines()) == 1
