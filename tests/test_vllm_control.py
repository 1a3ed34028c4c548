"""The runners on the installed vLLM's own decisions (`--control vllm`, `vllm-v2`): the V1 runner's
rebuilt steps decide as the mirror of its release does, the V2 runner's uniform decision is the
phase-aware rule, patches change vLLM only while applied, a FULL graph reads vLLM's own persistent
buffers, and the resumed-recompute hole of vLLM PR #53059 shows through vLLM's code. Marked
conformance: skipped, with the reason, where vLLM is not installed (`tox -e vllm033`)."""
from dataclasses import replace

import numpy as np
import pytest

from repro.capture.control import MirrorPaths, paths_for
from repro.control.batch import StepBatch
from repro.control.dispatch import prefilling, uniform_decode
from repro.errors import ReplayRefused
from repro.graphs import make_provider
from repro.islands import Model
from repro.job.cases import Case, default_sequence, run_case
from repro.job.steps import case_steps
from repro.knobs.control import Control
from repro.knobs.modes import Runtime, parse_mode
from repro.knobs.stacks import stack
from repro.scheduler.sequence import Request, Sequence
from repro.upstream.patches import applied
from repro.upstream.paths import why_not_drive
from repro.control.shape import StepShape

MISSING = why_not_drive()  # vLLM 0.33.0, whose model runners the control paths drive
pytestmark = [pytest.mark.conformance, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]
PR53059, PR47123, PR55123 = ("patches/vllm_pr53059.py", "patches/vllm_pr47123.py", "patches/vllm_pr55123.py")
FULL = parse_mode("full_and_piecewise")
V2_RULE = stack("vllm-0.33-mrv2").rules.uniform_decode  # the profile of the V2 runner, which the fixed stack takes
META = ("num_decodes", "num_prefills", "num_spec_decodes", "num_prefill_tokens", "num_spec_decode_tokens",
        "num_actual_tokens")
TENSORS = ("spec_state_indices", "non_spec_state_indices", "num_accepted_tokens", "spec_query_start_loc",
           "non_spec_query_start_loc", "has_initial_state")


def _paths(source, tiny_path, block_size=None, patches=()):
    return paths_for(Control(source, patches), stack("vllm-0.33-mrv1").rules, tiny_path, block_size)


def _geometry(seq, k):
    return FULL, StepShape(k, seq.num_slots, seq.max_tokens), "cpu", 0, 0


def _lists(meta):
    return {f: getattr(meta, f) for f in META} | {
        f: None if getattr(meta, f) is None else getattr(meta, f).tolist() for f in TENSORS}


@pytest.mark.parametrize("k, block, dp", [(2, None, False), (2, 4, False), (1, 4, False), (2, None, True)])
def test_vllms_v1_runner_decides_every_step_as_the_mirror_of_0_33_does(tiny_path, k, block, dp):
    """The rebuilt `_update_states` / `_prepare_inputs` / `_build_attention_metadata` / `_dummy_run`
    steps, over vLLM's persistent batch, dispatcher and builder, against the mirror under the
    vllm-0.33-mrv1 profile: the same graph key at every step, the same metadata and staged buffers,
    and a FULL dummy step re-stages the same rows."""
    # the other rank's batches left out: agreeing with them (`coordinate_batch_across_dp`) needs vLLM's
    # data-parallel group, so they are the mirror's alone (`job.steps.case_steps` drops them under vLLM)
    seq = replace(default_sequence(3 if dp else 0, 80, spec_tokens=k, block_size=block, data_parallel=dp),
                  dp_peers=None)
    mirror = MirrorPaths(stack("vllm-0.33-mrv1").rules).graph(*_geometry(seq, k))
    with _paths("vllm", tiny_path, block) as paths:
        v1 = paths.graph(*_geometry(seq, k))
        assert v1.sizes == mirror.sizes and v1.mode == mirror.mode
        kinds = set()
        for b in seq.batches():
            mirror.update(b)
            v1.update(b)
            assert v1.dispatch(b) == mirror.dispatch(b), b.step
            runtime, desc = mirror.dispatch(b)
            kinds.add(runtime)
            if not b.dummy:
                assert _lists(v1.metadata(b, runtime, desc)) == _lists(mirror.metadata(b, runtime, desc)), b.step
            elif runtime is Runtime.FULL:
                kinds.add("dummy")
                mirror.dummy(desc)
                v1.dummy(desc)
                assert v1.pad_state_indices(b, desc) == mirror.pad_state_indices(b, desc), b.step
                staged = v1.builder.builder.spec_state_indices_tensor[:desc.num_reqs].tolist()
                assert staged == mirror.builder.spec_state_indices[:desc.num_reqs].tolist(), b.step
        assert {Runtime.FULL, Runtime.PIECEWISE} <= kinds and ("dummy" in kinds) == dp


@pytest.mark.parametrize("k, block", [(0, None), (2, None), (2, 4)])
def test_vllms_v2_runner_calls_a_batch_uniform_by_the_phase_aware_rule(tiny_path, k, block):
    """`gather_batch_req_state` over the step (its prefill phase counts a resumed request's recompute)
    decides as the vllm-0.33-mrv2 profile's rule (the phase-aware rule, the fixed stack's), and its graph
    manager replays FULL exactly those steps whose tokens fit one of its FULL keys (the capture sizes
    rounded up to 1+k, within the largest size: `CudaGraphManager._init_candidates`)."""
    # seed 4: a stream with uniform decodes within the largest FULL size at each K and block size (seed 0's,
    # with block 4, decodes 5 requests at once: 15 tokens, above that size)
    seq = default_sequence(4, 120, spec_tokens=k, block_size=block)
    with _paths("vllm-v2", tiny_path, block) as paths:
        v2 = paths.graph(*_geometry(seq, k))
        top = max(d.num_tokens for m, ds in v2.manager._capture_descs.items() if m.name == "FULL" for d in ds)
        full = 0
        for b in [b for b in seq.batches() if not b.dummy]:
            rule = uniform_decode(V2_RULE, b.query_lens, prefilling(V2_RULE, b), k)
            runtime, desc = v2.dispatch(b)
            assert (runtime is Runtime.FULL) == (rule and b.num_tokens <= top), b.step
            full += runtime is Runtime.FULL
            assert desc.uniform == (runtime is Runtime.FULL)
        assert full


def _prompt_of_1_plus_k(k=2):
    """vLLM #53051's trigger: one prompt of exactly 1+k tokens, its first step."""
    return StepBatch([0], [1], [1 + k], [False], list(range(1, 2 + k)), num_computed=[0], prompt_lens=[1 + k],
                     draft_lens=[0], blocks=[[1, 2, 3]])


def test_a_patch_changes_vllms_decision_only_while_it_is_applied(tiny_path):
    b = _prompt_of_1_plus_k()
    seq = Sequence([Request(0, 3, 1)], num_slots=4, max_tokens=16, spec_tokens=2)
    with _paths("vllm", tiny_path) as paths:
        v1 = paths.graph(*_geometry(seq, 2))
        v1.update(b)
        assert v1.dispatch(b)[0] is Runtime.FULL  # 0.33.0's shape-only `_is_uniform_decode`
        for fix in (PR53059, PR47123):
            with applied(paths.up, [fix]):
                assert v1.dispatch(b)[0] is Runtime.PIECEWISE, fix
        with applied(paths.up, [PR55123]), pytest.raises(ReplayRefused, match="still in their prompt"):
            v1.dispatch(b)
        assert v1.dispatch(b)[0] is Runtime.FULL


@pytest.mark.parametrize("source", ["vllm", "vllm-v2"])
def test_the_full_graph_reads_vllms_own_persistent_buffers(tiny_path, source):
    """The capture metadata's state indices are views of vLLM's builder buffers (what a FULL graph
    captured over them reads at every replay); a decode-only step re-stages them in place."""
    seq = Sequence([Request(0, 2, 4), Request(1, 2, 4)], num_slots=4, max_tokens=16, spec_tokens=2)
    with _paths(source, tiny_path) as paths:
        path = paths.graph(*_geometry(seq, 2))
        decode = next(b for b in seq.batches() if b.num_reqs == 2 and b.query_lens == [3, 3])
        path.update(decode)
        runtime, desc = path.dispatch(decode)
        assert runtime is Runtime.FULL and desc.uniform
        buf = path.builder.builder.spec_state_indices_tensor
        cap = path.capture_metadata(desc)
        assert cap.spec_state_indices.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
        assert buf[:desc.num_reqs].tolist() == [[0, 0, 0]] * desc.num_reqs  # capture: all rows null
        path.metadata(decode, runtime, desc)
        assert buf[:2].tolist() == [r[:3] for r in decode.block_rows()]


# vLLM PR #53059's hole, found by this suite's soak (`tests/test_resumed_recompute.py`), as vLLM's own
# scheduler makes it (the smallest such stream, `tests/test_vllm_schedule.py`): one request, a prompt of
# 2, preempted after one decode that kept all 1+K tokens; vLLM resumes it with its prompt, its first token
# and the 3 kept (6 tokens) in chunks of the step budget, 3: the last, at step 3, is 1+K tokens all past
# its prompt.
TAIL = 3
RESUMED = Sequence([Request(0, 2, 2, preempt_after=1)], num_slots=1, max_tokens=3, spec_tokens=2)


@pytest.fixture(scope="module")
def model(tiny_path):
    return Model(tiny_path, "cpu")


@pytest.mark.parametrize("patch", [PR53059, PR47123])
def test_the_resumed_recompute_replays_the_unstaged_full_graph_through_vllms_code(model, patch):
    seq = RESUMED
    last = case_steps(Case("chain", "full_and_piecewise", control=Control("vllm")), seq)[TAIL]
    assert last.query_lens == [3] and last.prompts()[0] <= last.computed()[0] < last.prefills()[0]
    provider = make_provider("cpu")
    hole = run_case(model, provider, Case("chain", "full_and_piecewise", spec_tokens=2,
                                          control=Control("vllm", (patch,))), seq)
    assert hole.detected and hole.failure.step == TAIL, hole.failure
    v2 = run_case(model, provider, Case("chain", "full_and_piecewise", spec_tokens=2, control=Control("vllm-v2")), seq)
    assert not v2.detected, v2.failure


def test_an_idle_ranks_dummy_steps_run_on_vllms_decisions(model):
    """Dummy steps (`_dummy_run(1+k, uniform_decode=True)`): both runners commit (V1) or zero (V2) the
    rows they build from, so the FULL dummy replays of 0.33.0 leave the run clean."""
    seq = default_sequence(3, 40, spec_tokens=2, data_parallel=True)
    assert any(b.dummy for b in seq.batches())
    provider = make_provider("cpu")
    for source in ("vllm", "vllm-v2"):
        patches = (PR53059,) if source == "vllm" else ()
        r = run_case(model, provider, Case("chain", "full_and_piecewise", spec_tokens=2, data_parallel=True,
                                           control=Control(source, patches)), seq)
        assert not r.detected and r.steps == len(seq.batches()), (source, r.failure)
        assert np.isfinite(r.replay_us)


def test_the_trace_names_the_inconsistent_step_and_the_v2_rule_has_none(tiny_path):
    """`upstream.trace.decisions`: under PR #53059's hunk the resumed recompute's last chunk is a FULL
    replay the builder did not stage: it reads the rows the last decode staged (the blocks the request
    held before its preemption), not its own; under the V2 runner's decisions the same stream has none."""
    from repro.upstream.trace import decisions, first_inconsistent
    steps = case_steps(Case("chain", "full_and_piecewise", control=Control("vllm")), RESUMED)
    found = {}
    for source, patches in (("vllm", (PR53059,)), ("vllm-v2", ())):
        with _paths(source, tiny_path, patches=patches) as paths:
            path = paths.graph(FULL, StepShape(2, RESUMED.num_slots, RESUMED.max_tokens), "cpu", 0, 0)
            found[source] = first_inconsistent(decisions(path, steps))
    bad = found["vllm"]
    assert bad["step"] == TAIL and bad["runtime"] == "FULL" and not bad["staged"]
    assert bad["requests"][0]["phase"] == "recompute past its prompt" and bad["builder"]["num_prefills"] == 1
    before = next(e for e in reversed(steps[:TAIL]) if e.query_lens == [3] and e.computed()[0] >= e.prompts()[0])
    assert bad["graph_reads"] == [before.block_rows()[0][:3]] and bad["own_rows"] != bad["graph_reads"]
    assert found["vllm-v2"] is None


@pytest.mark.slow
def test_the_upstream_report_and_its_script_need_only_torch_and_vllm(model, tmp_path):
    """`repro report` of the finding: REPORT.md names the inconsistent step and the functions; the
    script, run here in a fresh interpreter, exits 1 under PR #53059's hunk and 0 under the V2 rule."""
    from repro.report.upstream import SCRIPT, write_upstream_report
    from repro.scheduler.sequence import request_json
    from repro.upstream.paths import control_json
    ctl = Control("vllm", (PR53059,))
    case = Case("chain", "full_and_piecewise", spec_tokens=2, control=ctl)
    minimal = {**{k: v for k, v in RESUMED.to_json().items() if k != "steps"}, "max_steps": TAIL + 1,
               "requests": [request_json(r, ("accept",)) for r in RESUMED.requests]}
    r = run_case(model, make_provider("cpu"), case, Sequence.from_json(minimal))
    assert r.detected and r.failure.step == TAIL
    doc = {"device": "cpu", "graph_provider": "cpu-tape", "checkpoint": str(model.path), "kernel_sentinel": 0,
           "stack": "fixed", **control_json(ctl), "spec_tokens": 2, "minimal_sequence": minimal,
           "results": [r.to_json()], "command": "repro hunt --control vllm --patch patches/vllm_pr53059.py"}
    written = write_upstream_report(doc, tmp_path / "rep")
    assert {"REPORT.md", SCRIPT, "decisions.json", "sequence.json", "result.json"} <= set(written)
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert md.startswith("# vLLM PR #53059: a preempted request's recompute")
    assert f"| {TAIL} | 0: 3," in md and "**inconsistent**" in md and "GPUModelRunner._is_uniform_decode" in md
    assert "Run here with `--rule pr53059`: exit 1" in md and "Run here with `--rule v2`: exit 0" in md


def test_the_v2_runners_dummy_run_restages_its_buffers_from_zeroed_rows(tiny_path):
    """An idle rank's dummy step under the V2 runner (`_dummy_run(1, uniform_decode=True)`): one
    request of 1+k tokens, uniform by construction, the FULL key of 1+k tokens; its metadata built for
    capture over `get_dummy_block_tables`' zeroed rows re-stages the builder's buffers, so the replay
    reads the null block, not the rows the last real decode staged (vLLM #49757, #37728)."""
    seq = Sequence([Request(0, 2, 2), Request(1, 2, 2)], num_slots=4, max_tokens=16, spec_tokens=2)
    dummy = StepBatch([], [], [], [], [], step=99, dummy=True)
    with _paths("vllm-v2", tiny_path) as paths:
        v2 = paths.graph(*_geometry(seq, 2))
        decode = next(b for b in seq.batches() if b.query_lens == [3, 3])
        runtime, desc = v2.dispatch(decode)
        v2.metadata(decode, runtime, desc)
        buf = v2.builder.builder.spec_state_indices_tensor
        assert buf[:2].tolist() == [r[:3] for r in decode.block_rows()]
        runtime, desc = v2.dispatch(dummy)
        assert runtime is Runtime.FULL and (desc.num_tokens, desc.num_reqs, desc.uniform) == (3, 1, True)
        v2.dummy(desc)
        assert buf[:desc.num_reqs].tolist() == [[0, 0, 0]]


@pytest.mark.parametrize("k, block, dp", [(2, None, False), (2, 4, False), (2, None, True)])
def test_the_persistent_batch_the_path_keeps_is_the_one_vllms_scheduler_rows_show(tiny_path, k, block, dp):
    """The path's `_update_states` (from the steps) and the scheduler seam's (`rows.Rows`, from vLLM's
    `SchedulerOutput`) are two rebuilds of one function: on vLLM's steps they hold the same requests
    in the same rows, with the same computed counts and block-table rows."""
    seq = default_sequence(3 if dp else 0, 60, spec_tokens=k, block_size=block, data_parallel=dp)
    steps = case_steps(Case("chain", "full_and_piecewise", control=Control("vllm")), seq)
    with _paths("vllm", tiny_path, block) as paths:
        v1 = paths.graph(*_geometry(seq, k))
        for b in steps:
            v1.update(b)
            if b.dummy:
                assert v1.batch.num_reqs == 0
                continue
            assert list(v1.batch.req_ids) == [str(r) for r in b.request_ids], b.step
            rows = [v1.batch.req_id_to_index[str(r)] for r in b.request_ids]
            assert v1.batch.num_computed_tokens_cpu[rows].tolist() == b.computed(), b.step
            width = max(len(r) for r in b.block_rows())
            assert v1.ib.table[rows, :width].tolist() == [r + [0] * (width - len(r)) for r in b.block_rows()], b.step


@pytest.mark.slow
def test_a_blind_hunt_on_vllm_finds_53051_and_names_the_patches_that_clear_it(tmp_path):
    """`repro hunt --control vllm --spec-tokens 2` (no patch, no hazard): vLLM 0.33.0's V1 runner as
    released; the minimal finding is a prompt of 1+K tokens (vLLM #53051), cleared by PR #53059's and
    PR #47123's hunks, made loud by PR #55123's, and clear under the V2 runner's decisions."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    save = tmp_path / "h.json"
    out = subprocess.run([sys.executable, "-m", "repro", "hunt", "--control", "vllm", "--spec-tokens", "2",
                          "--device", "cpu", "--max-examples", "30", "--save", str(save)],
                         capture_output=True, text=True, cwd=root, timeout=1800)
    assert out.returncode == 1, out.stderr[-2000:]
    doc = json.loads(save.read_text())
    assert doc["minimal_sequence"]["requests"] == [
        {"rid": 0, "prompt_len": 3, "decode_steps": 0, "arrive": 0, "preempt_after": None, "accept": None}]
    blame = doc["blame"]
    assert {Path(p).stem for p in blame["patches"]["clears"]} == {"vllm_pr53059", "vllm_pr47123"}
    assert [Path(p).stem for p in blame["patches"]["loud"]] == ["vllm_pr55123"] and blame["v2_clears"]
    assert "vllm_pr53059 clears it: vLLM PR #53059" in out.stdout
