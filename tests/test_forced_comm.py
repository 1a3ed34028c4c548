"""forced_comm: the TP slice with its all-reduce captured in the graph, on real ranks.

Each multi-rank test spawns the ranks (gloo on CPU, the CPU tape records and re-issues the
all-reduce; nccl + CUDA graphs when two NVIDIA GPUs are present) and runs lockstep eager vs
replay with bit-exact comparisons. One launch runs every case of the default plan; the tests
below read its results.
"""
import json
import os
import time

import pytest
import torch

from repro.cli.app import main
from repro.comm import CommCase, exit_code, plan, run_forced_comm
from repro.errors import BadInput
from repro.islands.forced_comm import comm_mode_for, load_slice, shard_shared_expert
from repro.model.tiny import default_checkpoint

pytestmark = pytest.mark.forced_comm

STEPS = 24


def _by_case(res):
    return {(tuple(r["hazards"]), tuple(r["repairs"])): r for r in res["results"]}


def _all_steps(r, res):
    return r["steps"] == res["planned_steps"]


@pytest.fixture(scope="module")
def ckpt(cache):
    return default_checkpoint(cache)


def _run(ckpt, **kw):
    from repro.scheduler.sequence import random_sequence
    batches = random_sequence(0, num_requests=max(2, STEPS // 6), vocab=512).batches()[:STEPS]
    res = run_forced_comm(ckpt, batches=batches, **kw)
    res["planned_steps"] = len(batches)
    return res


@pytest.fixture(scope="module")
def tp2(ckpt):
    """Every default case on 2 ranks over gloo, one launch."""
    res = _run(ckpt, tp=2, device="cpu", cases=plan(), timeout=120)
    assert res["failure"] is None, res["failure"]
    return res


def _no_process_left(pids):
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# --------------------------------------------------------------------------- no ranks needed


def test_checkpoint_sharding_of_the_shared_expert_is_vllms(ckpt):
    from repro.model.checkpoint import Checkpoint
    ck = Checkpoint.open(ckpt)
    full = ck.load_layer(0).moe
    Is = ck.config.shared_expert_intermediate_size
    gates, ups = [], []
    for r in range(2):
        w = load_slice(ck, 0, r, 2, vocab=64)
        gu, dn = shard_shared_expert(full, r, 2)
        assert torch.equal(w.gate_up.weight, gu.weight) and torch.equal(w.gate_up.scale, gu.scale)
        assert torch.equal(w.down.weight, dn.weight) and torch.equal(w.down.scale, dn.scale)
        assert w.gate_up.weight.shape == (Is, ck.config.hidden_size) and w.down.weight.shape[1] == Is // 2
        gates.append(w.gate_up.weight[: Is // 2])
        ups.append(w.gate_up.weight[Is // 2:])
    assert torch.equal(torch.cat(gates + ups), full.shared_gate_up.weight)  # [gate_0; up_0] | [gate_1; up_1]


def test_knobs_map_to_comm_modes_and_foreign_knobs_are_refused():
    assert comm_mode_for() == "in-graph"
    assert comm_mode_for(["comm-noop-capture"]) == "noop-capture"
    assert comm_mode_for(["comm-noop-capture"], ["eager-family=comm"]) == "eager-split"
    assert comm_mode_for(["allreduce-no-clone"]) == "registered"
    assert comm_mode_for(["allreduce-no-clone"], ["clone-input"]) == "registered"
    assert comm_mode_for(["comm-graph-then-eager"]) == "in-graph"
    for bad in (["stale-pad"], ["no-such-hazard"]):
        with pytest.raises(BadInput, match="forced_comm"):
            plan(bad)
    with pytest.raises(BadInput):
        plan((), ["sanitize-pad"])
    with pytest.raises(BadInput, match="captured"):
        plan(["comm-graph-then-eager"], ["eager-family=comm"])
    assert CommCase(("comm-noop-capture",)).expect == "diverged"
    assert CommCase(("comm-graph-then-eager",)).expect == "clean"


def test_multi_rank_rows_go_through_the_shared_verdict_table_and_exit_code():
    from repro.job.results import MultiRankResult, format_table, rank_divergence, verdict
    from repro.job.results import exit_code as shared_exit_code
    hit = MultiRankResult(CommCase(("comm-noop-capture",)), 1, rank_divergence(0, 0, "forced_comm", "out", 0, 1, 2.0),
                          eager_us=10.0, ranks_diverged=[1])
    clean = MultiRankResult(CommCase(), 12, None, eager_us=10.0, replay_us=15.0, captures=2, replays=1,
                            collectives_in_graphs=2)
    missed = MultiRankResult(CommCase(("allreduce-no-clone",)), 3, None)
    run = {"tp": 2, "backend": "gloo", "device": "cpu", "graph_provider": "cpu-tape", "comm_dtype": "auto",
           "elapsed_s": 1.04, "failure": None}
    assert [verdict(r) for r in (hit, clean, missed)] == ["detected", "ok", "MISSED"]
    assert verdict(MultiRankResult(CommCase(), 0, None, ran=False)) == "not run"
    table = format_table([hit, clean], run=run)
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["island", "comm", "mode"] and "class" not in lines[0]
    assert lines[2].endswith("detected  1") and lines[3].endswith("ok")  # no timing column
    assert "[1] difference: step 0 rank 1 out row 0 |d|=2" in table
    assert lines[-1] == "tp 2 over gloo on cpu, provider cpu-tape, comm dtype auto, 1.0 s"
    assert hit.to_json()["first_divergence"] == {"index": 0, "step": 0, "island": "forced_comm", "tensor": "out",
                                                 "row": 0, "rank": 1, "max_abs": 2.0}
    assert hit.to_json()["verdict"] == "detected" and clean.to_json()["collectives_in_graphs"] == 2
    assert shared_exit_code([hit, clean], False, run=run) == 0
    assert shared_exit_code([hit, clean], True, run=run) == 1
    assert shared_exit_code([missed], False, run=run) == 1  # a miss fails a multi-rank run too
    assert shared_exit_code([missed]) == 1  # single-rank: a miss fails the run
    failed = {**run, "failure": {"kind": "died", "detail": "rank 1 died (signal 9)", "case": None, "phase": "load"}}
    assert shared_exit_code([clean], False, run=failed) == 1
    assert "FAILED: died: rank 1 died (signal 9) (at phase load)" in format_table([clean], run=failed)


@pytest.mark.parametrize("tp, match", [(1, "tp >= 2"), (3, "does not divide")])
def test_bad_tp_is_bad_input_before_any_rank_starts(ckpt, tp, match):
    with pytest.raises(BadInput, match=match):
        run_forced_comm(ckpt, tp=tp, device="cpu")


def test_cli_refuses_a_hazard_of_another_island_with_bad_input(ckpt, capsys):
    rc = main(["run", "--model", str(ckpt), "--device", "cpu", "--tp", "2", "--hazard", "stale-pad", "--steps", "4",
               "--island", "forced_comm"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "stale-pad" in err[0]


# --------------------------------------------------------------------------- 2 ranks, every case


def test_baseline_in_graph_all_reduce_replays_bit_exactly_on_2_ranks(tp2):
    r = _by_case(tp2)[((), ())]
    assert r["comm_mode"] == "in-graph"
    assert not r["diverged"], r["first_divergence"]
    assert _all_steps(r, tp2)
    assert r["collectives_in_graphs"] >= r["captures"] >= 2  # the all-reduce is on the tape, one per size
    assert r["replays"] >= STEPS - r["captures"]
    _no_process_left(tp2["pids"])
    assert tp2["leftover"] == []


def test_comm_noop_capture_is_detected_and_eager_family_comm_clears_it(tp2):
    cases = _by_case(tp2)
    hit = cases[(("comm-noop-capture",), ())]
    assert hit["diverged"] and hit["verdict"] == "detected"
    fd = hit["first_divergence"]
    assert fd["tensor"] == "out" and fd["max_abs"] > 0 and fd["rank"] in (0, 1) and fd["row"] is not None
    assert hit["collectives_in_graphs"] == 0  # the no-op communicator left nothing to replay
    fixed = cases[(("comm-noop-capture",), ("eager-family=comm",))]
    assert fixed["comm_mode"] == "eager-split"
    assert not fixed["diverged"], fixed["first_divergence"]
    assert _all_steps(fixed, tp2)


def test_allreduce_no_clone_is_detected_and_clone_input_clears_it(tp2):
    cases = _by_case(tp2)
    hit = cases[(("allreduce-no-clone",), ())]
    assert hit["diverged"] and hit["verdict"] == "detected"
    assert hit["first_divergence"]["tensor"] == "out"
    fixed = cases[(("allreduce-no-clone",), ("clone-input",))]
    assert fixed["comm_mode"] == "registered"
    assert not fixed["diverged"], fixed["first_divergence"]
    assert _all_steps(fixed, tp2)


def test_pytorch_189403_pattern_is_clean_on_gloo(tp2):
    r = _by_case(tp2)[(("comm-graph-then-eager",), ())]
    assert r["comm_mode"] == "in-graph" and r["collectives_in_graphs"] >= 1
    assert not r["diverged"], r["first_divergence"]
    assert _all_steps(r, tp2)
    assert exit_code(tp2, explicit_hazards=False) == 0  # every unrepaired hazard diverged, the rest clean


# --------------------------------------------------------------------------- 4 ranks, CLI, failures


def test_baseline_replays_bit_exactly_on_4_ranks(ckpt):
    res = _run(ckpt, tp=4, device="cpu", cases=[((), ())], timeout=120)
    assert res["failure"] is None, res["failure"]
    r = res["results"][0]
    assert not r["diverged"], r["first_divergence"]
    assert _all_steps(r, res) and r["collectives_in_graphs"] >= 2
    assert res["leftover"] == []


def test_cli_reports_a_planted_hazard_with_exit_1_and_json(ckpt, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["run", "--model", str(ckpt), "--device", "cpu", "--tp", "2", "--hazard", "comm-noop-capture",
                 "--steps", "6", "--json", str(out), "--island", "forced_comm"]) == 1
    printed = capsys.readouterr().out
    assert "comm-noop-capture" in printed and "detected" in printed
    d = json.loads(out.read_text())
    assert d["results"][0]["diverged"] and d["results"][0]["first_divergence"]["tensor"] == "out"
    assert {"device", "graph_provider", "torch", "checkpoint", "results"} <= set(d)


def test_a_killed_rank_is_reported_within_60_s_and_nothing_is_left(ckpt):
    t = time.monotonic()
    res = _run(ckpt, tp=2, device="cpu", cases=[((), ())], timeout=60, collective_timeout=20, kill_rank=(1, 3))
    assert time.monotonic() - t < 60
    f = res["failure"]
    assert f is not None and f["kind"] == "died" and f["rank"] == 1 and f["step"] is not None and f["index"] == 3
    assert f["ranks"][1]["signal"] == 9
    assert res["diverged"] and exit_code(res, False) == 1
    _no_process_left(res["pids"])
    assert res["leftover"] == []


@pytest.mark.exclusive  # a hang is told from a slow rank by wall-clock
def test_a_hung_rank_is_reported_as_hung_with_where_it_stopped(ckpt):
    t = time.monotonic()
    res = _run(ckpt, tp=2, device="cpu", cases=[((), ())], timeout=60, collective_timeout=5, kill_rank=(0, 2, "hang"))
    assert time.monotonic() - t < 45
    f = res["failure"]
    assert f is not None and f["kind"] == "hung" and f["rank"] == 0 and f["index"] == 2 and f["phase"] == "hang"
    _no_process_left(res["pids"])
    assert res["leftover"] == []


# --------------------------------------------------------------------------- CUDA / NCCL


@pytest.mark.cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 NVIDIA GPUs")
def test_every_case_on_2_gpus_with_nccl_and_cuda_graphs(ckpt):
    res = _run(ckpt, tp=2, device="cuda", cases=plan(), timeout=300)
    assert res["failure"] is None, res["failure"]
    assert res["backend"] == "nccl" and res["graph_provider"] == "cuda"
    cases = _by_case(res)
    for key, r in cases.items():
        assert r["verdict"] in ("ok", "detected"), (key, r)
        if r["expect"] == "clean":
            assert _all_steps(r, res), (key, r)
    assert cases[(("comm-noop-capture",), ())]["diverged"]
    assert cases[(("allreduce-no-clone",), ())]["diverged"]
    assert not cases[(("comm-graph-then-eager",), ())]["diverged"]
    _no_process_left(res["pids"])
