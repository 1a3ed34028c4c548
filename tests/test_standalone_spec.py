"""The generated standalone script with draft tokens: its runner's spec rules are the suite's, a K = 2
baseline replays equal to eager through FULL spec decodes and mixed batches, and a blind hunt's
vLLM #53051 finding reproduces in it at the suite's first divergence, under the stack it ran on."""
import collections
import json
import types
from itertools import product

import numpy as np
import pytest

from repro.control import dispatch
from repro.control.batch import StepBatch
from repro.control.builder import draft_counts
from repro.knobs.options import ControlRules, UniformDecode
from repro.knobs.modes import Runtime, parse_mode
from repro.report import SCRIPT
from repro.control.shape import StepShape
from tests.scripts import module, report, run_script, template_module

# the one-request sequence a blind hunt of vllm-0.33-mrv1 at K = 2 shrinks to: a 3-token prompt
PROMPT_OF_1_PLUS_K = {
    "requests": [{"rid": 0, "prompt_len": 3, "decode_steps": 0, "arrive": 0, "preempt_after": None, "accept": None}],
    "num_slots": 16, "max_tokens": 16, "vocab": 512, "seed": 0, "spec_tokens": 2, "data_parallel": False,
    "tail_dummies": 0,
    "steps": [{"step": 0, "request_ids": [0], "slots": [1], "query_lens": [3], "has_initial_state": [False],
               "token_ids": [105, 434, 251], "live_slots": [], "num_computed": [0], "prompt_lens": [3],
               "draft_lens": [0], "num_accepted": [1], "blocks": [[1, 2, 3]]}]}


def test_the_templates_capture_sizes_and_draft_counts_are_the_suites():
    """The script rounds capture sizes (`adjust_cudagraph_sizes_for_spec_decode`) and counts a row's
    drafts (`_prepare_inputs`) as `repro.control` does, for every mode, K and row shape drawn."""
    t = template_module("template")
    for name, k in product(("none", "piecewise", "full_decode_only", "full_and_piecewise"), range(5)):
        mode = parse_mode(name)
        sizes = dispatch.default_capture_sizes(8, 16 * (1 + k), k)
        full = t.MODES[name][0] == "full"
        assert list(t.capture_sizes(sizes, full, k)) == list(dispatch.capture_sizes(sizes, mode, k)), (name, k)
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 6))
        q, d = rng.integers(1, 5, n).tolist(), rng.integers(0, 4, n).tolist()
        c, p = rng.integers(0, 6, n).tolist(), rng.integers(1, 6, n).tolist()
        st = {"query_lens": q, "draft_lens": d, "num_computed": c, "prompt_lens": p}
        for zero in (True, False):  # `control.zero_draft_spec_row`: vLLM 0.33.0's form and 0.26.0's
            assert t.draft_counts(st, zero) == draft_counts(q, d, c, p, ControlRules(zero_draft_spec_row=zero)).tolist(), st


def test_the_templates_dispatch_agrees_with_the_other_rank_as_the_suite_does():
    """A step naming the other data-parallel rank's batch (`dp_peer`) dispatches in the script as the
    mirror's `dispatch_step` does (`coordinate_batch_across_dp`: the lesser runtime at the larger
    padded size), for every mode, K, own batch and peer drawn; a dummy step too."""
    t = template_module("template_dp")
    rng = np.random.default_rng(1)
    name_of = {Runtime.NONE: None, Runtime.PIECEWISE: "piecewise", Runtime.FULL: "full"}
    seen = collections.Counter()
    for name, k in product(("piecewise", "full_decode_only", "full_and_piecewise"), range(4)):
        sizes, q = dispatch.default_capture_sizes(4, 16, k), 1 + k
        ours = dispatch.Dispatcher(parse_mode(name), sizes, StepShape(k, 4))
        runner = types.SimpleNamespace(k=k, sizes=t.capture_sizes(sizes, t.MODES[name][0] == "full", k), max_num_seqs=4,
                                       opts={"control.uniform_decode": "shape"})
        runner.decode, runner.mixed = t.MODES[name]
        runner._key = types.MethodType(t.GraphRunner._key, runner)
        for _ in range(150):
            n = int(rng.integers(1, 5))
            lens = [q] * n if rng.random() < 0.5 else rng.integers(1, q + 3, n).tolist()
            peer = [[0, True], [q * int(rng.integers(1, 5)), True], [int(rng.integers(1, 24)), False]][rng.integers(3)]
            dummy = rng.random() < 0.15
            b = StepBatch([], [], [], [], [], dummy=True, dp_peer=peer) if dummy else StepBatch(
                list(range(n)), list(range(1, n + 1)), lens, [True] * n, [1] * sum(lens), dp_peer=peer)
            runtime, desc = dispatch.dispatch_step(ours, b, UniformDecode.SHAPE)
            st = b.to_json() | ({"dummy": True} if dummy else {})
            got = t.GraphRunner.dispatch(runner, st)
            assert (got[0], got[1]) == (name_of[runtime], desc.num_tokens), (name, k, st, runtime, desc)
            seen[(name_of[runtime], desc.num_tokens > b.num_tokens if not dummy else "dummy")] += 1
    assert seen[("full", True)] and seen[("piecewise", True)] and seen[(None, False)], seen


@pytest.mark.parametrize("mode, mixed_runtime", [("full_and_piecewise", "piecewise"), ("full_decode_only", None)])
def test_a_k2_baseline_replays_equal_to_eager_through_full_spec_decodes_and_mixed_batches(mode, mixed_runtime,
                                                                                          tiny_path, tmp_path):
    """80 steps at K = 2: the script's runner replays FULL graphs of spec rows and runs batches that
    mix spec rows with prefills (PIECEWISE graphs, or eagerly where the mode has none), and replay
    equals eager at every step."""
    island = "gdn_core" if mode == "full_and_piecewise" else "chain"  # gdn_core alone is checked in its mode only
    _, rep = report(tmp_path, ["--model", tiny_path, "--mode", mode, "--spec-tokens", "2",
                               "--steps", "80", "--seed", "3", "--island", island])
    script = module(rep / SCRIPT, "script_k2")
    seen = collections.Counter()
    dispatch0, spec0 = script.GraphRunner.dispatch, script.MetadataBuilder._spec

    def counted_dispatch(self, st):
        out = dispatch0(self, st)
        seen[out[0]] += 1
        return out

    def counted_spec(self, st, rows):
        meta = spec0(self, st, rows)
        seen["mixed" if meta["mixed"] else "spec"] += 1
        return meta
    script.GraphRunner.dispatch, script.MetadataBuilder._spec = counted_dispatch, counted_spec
    assert script.main(["--device", "cpu"]) == 0
    assert seen["full"] and seen[mixed_runtime] and seen["mixed"] and seen["spec"], seen


def test_the_scripts_replay_side_assertion_refuses_a_full_replay_of_a_prompt(tiny_path, tmp_path, capsys):
    """vLLM PR #55123 (`control.assert_full_past_prompt`): with the shape-only rule, the 3-token prompt
    is dispatched to the FULL graph; with the assertion on, the script refuses that replay (exit 1,
    REFUSED at step 0) instead of diverging, as the suite's runner raises `ReplayRefused`."""
    seq = tmp_path / "seq.json"
    seq.write_text(json.dumps(PROMPT_OF_1_PLUS_K))
    _, rep = report(tmp_path, ["--model", tiny_path, "--sequence", str(seq), "--stack", "vllm-0.33-mrv1",
                               "--mode", "full_and_piecewise", "--island", "gdn_core"])
    script = module(rep / SCRIPT, "script_assert")
    spec = json.loads(script.SPEC_JSON)
    assert spec["rules"]["uniform_decode"] == "shape" and spec["rules"]["assert_full_past_prompt"] is False
    spec["rules"]["assert_full_past_prompt"] = True
    script.SPEC_JSON = json.dumps(spec)
    capsys.readouterr()
    assert script.main(["--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "REFUSED: step 0: a FULL graph" in out and "REPRODUCED" not in out, out
    spec["rules"]["uniform_decode"] = "past-prompt"  # the fixed rule never dispatches it to FULL
    script.SPEC_JSON = json.dumps(spec)
    assert script.main(["--device", "cpu"]) == 0


@pytest.mark.parametrize("stack, expect", [("vllm-0.33-mrv1", 1), ("fixed", 0)])
def test_a_blind_53051_finding_reproduces_in_the_script_under_its_stack(stack, expect, tiny_path, tmp_path):
    """The rules travel with the result: under vLLM 0.33.0's rules the script's FULL graph swallows
    the 3-token prompt at the suite's first divergence; under the fixed stack it is clean."""
    seq = tmp_path / "seq.json"
    seq.write_text(json.dumps(PROMPT_OF_1_PLUS_K))
    _, rep = report(tmp_path, ["--model", tiny_path, "--sequence", str(seq), "--stack", stack,
                               "--mode", "full_and_piecewise", "--island", "gdn_core"])
    doc = json.loads((rep / "result.json").read_text())
    p, got = run_script(rep)
    assert p.returncode == expect, p.stdout + p.stderr
    if expect:
        fd = doc["results"][0]["first_divergence"]
        assert (got["step"], got["island"], got["tensor"]) == (fd["step"], fd["island"], fd["tensor"])
        text = (rep / "REPORT.md").read_text()  # the report blames the stack's rules, not the graph stack
        assert "depart from the fixed form in `uniform_decode`" in text and "vLLM #53051" in text
        assert "`repro run --repair R --sequence sequence.json`: the file keeps the stack" in text
