"""One forced_comm rank: join the process group, load this rank's TP shard, run every case in
lockstep (eager reference vs replay through `SliceRunner`), and gather the results to rank 0.

Every rank builds its shard of the island twice, feeds both copies the same token-id batches and
compares the outputs bit for bit after every step. A divergence on any rank stops every rank at
that step (a MAX all-reduce of a flag on a separate gloo group, so control traffic never touches
the communicator under test). Graphs are released before `destroy_process_group()` (on H200s it
hangs while a graph holding a captured collective is alive), and the rank leaves with `os._exit`
so a wedged communicator cannot hold its exit.
"""
from __future__ import annotations

import datetime
import json
import os
import pickle
import signal
import sys
import threading
import time
import traceback

import torch

from ..knobs import hazards as hz
from ..check.compare import Divergence
from ..job.results import MultiRankResult, device_name, rank_divergence
from .cases import ISLAND, CommCase
from ..graphs import make_provider
from ..islands.forced_comm import load_slice
from ..capture.slice import SliceRunner
from ..islands.forced_comm import Communicator, ForcedComm, eager_all_reduce_probe, resolve_comm_dtype

class _Progress:
    """Where this rank is, in a file the parent reads when something goes wrong."""

    def __init__(self, outdir: str, rank: int):
        self.path = os.path.join(outdir, f"progress.{rank}.json")
        self.state: dict = {"rank": rank}

    def mark(self, **kw) -> None:
        self.state.update(kw, time=time.time())
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.state, f)
        os.replace(tmp, self.path)


def _exit_with_parent(ppid: int) -> None:
    def watch():
        while True:
            time.sleep(0.5)
            if os.getppid() != ppid:
                os._exit(3)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _rank_main(rank: int, spec: dict) -> None:
    try:
        os.setpgid(0, 0)  # the parent kills this rank's whole group
    except OSError:
        pass
    _exit_with_parent(os.getppid())
    progress = _Progress(spec["outdir"], rank)
    code = 0
    try:
        _rank_run(rank, spec, progress)
    except BaseException:
        code = 1
        with open(os.path.join(spec["outdir"], f"error.{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: a wedged communicator must not hold the exit


def _rank_run(rank: int, spec: dict, progress: _Progress) -> None:
    import torch.distributed as dist


    progress.mark(phase="init")
    kind, tp = spec["kind"], spec["tp"]
    torch.set_num_threads(spec["threads"])
    if kind == "cpu":
        dev = torch.device("cpu")
    else:
        dev = torch.device(kind, rank)
        (torch.cuda if kind == "cuda" else torch.xpu).set_device(rank)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this machine
    td = datetime.timedelta(seconds=spec["timeout_s"])
    kw = {"device_id": dev} if spec["backend"] == "nccl" else {}
    dist.init_process_group(spec["backend"], init_method=spec["init"], rank=rank, world_size=tp, timeout=td, **kw)
    try:
        group = dist.group.WORLD
        control = dist.new_group(backend="gloo", timeout=td)
        provider = make_provider("cpu" if kind == "cpu" else f"{kind}:{rank}")
        progress.mark(phase="load")
        weights = load_slice(spec["checkpoint"], spec["layer"], rank, tp, dev, spec["vocab"])
        mine = []
        for ci, (hzs, rp) in enumerate(spec["cases"]):
            mine.append(_run_case(rank, ci, CommCase(tuple(hzs), tuple(rp)), weights, provider, group, control,
                                  spec, progress))
        progress.mark(phase="gather")
        gathered = [None] * tp if rank == 0 else None
        dist.gather_object(mine, gathered, dst=0, group=control)
        if rank == 0:
            cases = [CommCase(tuple(h), tuple(r)) for h, r in spec["cases"]]
            out = {"device": device_name(dev), "graph_provider": provider.name,
                   "results": [_merge(c, [g[i] for g in gathered]) for i, c in enumerate(cases)]}
            # pickled, not JSON: the parent gets the result objects with their Divergence objects
            tmp = os.path.join(spec["outdir"], "result.pkl.tmp")
            with open(tmp, "wb") as f:
                pickle.dump(out, f)
            os.replace(tmp, os.path.join(spec["outdir"], "result.pkl"))
        progress.mark(phase="teardown")
        dist.barrier(group=control)
    finally:
        import gc
        gc.collect()  # graphs are gone (each case released its own) before the group is torn down
        dist.destroy_process_group()
    progress.mark(phase="done")


def _merge(case: CommCase, per_rank: list[dict]) -> MultiRankResult:
    """One case's result over every rank: the earliest divergence (step index, then rank), the
    most steps any rank ran, timings averaged (rounded here, so the table's ratio is the JSON's)."""
    divs = [d["first_divergence"] for d in per_rank if d["first_divergence"] is not None]
    first = min(divs, key=lambda d: (d.context["index"], d.rank)) if divs else None
    n = len(per_rank)
    return MultiRankResult(case, max(d["steps"] for d in per_rank), first,
                           eager_us=round(sum(d["eager_us"] for d in per_rank) / n, 1),
                           replay_us=round(sum(d["replay_us"] for d in per_rank) / n, 1),
                           ranks_diverged=sorted(d.rank for d in divs), captures=per_rank[0]["captures"],
                           replays=per_rank[0]["replays"],
                           collectives_in_graphs=per_rank[0]["collectives_in_graphs"])


def _diff(index: int, step: int, tensor: str, rank: int, eager: torch.Tensor,
          replay: torch.Tensor) -> Divergence | None:
    """None when bit-identical (NaN matching NaN), else where and how much they differ."""
    a, b = eager.detach().cpu(), replay.detach().cpu()
    if a.shape != b.shape:
        return rank_divergence(index, step, ISLAND, tensor, None, rank, float("inf"),
                               detail=f"shape {tuple(a.shape)} vs {tuple(b.shape)}")
    same = (a == b) | (torch.isnan(a.float()) & torch.isnan(b.float()))
    if bool(same.all()):
        return None
    rows = ~same.reshape(same.shape[0], -1).all(-1)
    d = torch.nan_to_num((a.float() - b.float()).abs(), nan=float("inf"))
    return rank_divergence(index, step, ISLAND, tensor, int(rows.int().argmax()), rank, float(d.max()))


def _run_case(rank, ci, case: CommCase, weights, provider, group, control, spec, progress) -> dict:
    import torch.distributed as dist


    tp, dev = spec["tp"], weights.embed.device
    dtype = resolve_comm_dtype(spec["comm_dtype"], tp)
    mode = case.mode
    opts = hz.options_for(case.hazards, case.repairs).comm
    eager = ForcedComm(weights, Communicator(group, dtype), "in-graph", max_tokens=spec["max_tokens"])
    replay = ForcedComm.build(None, tp_rank=rank, tp_size=tp, group=group, mode=mode, comm_dtype=spec["comm_dtype"],
                              clone_input=opts.clone_input, max_tokens=spec["max_tokens"],
                              weights=weights, noop_capture=opts.noop_capture)
    runner = SliceRunner(replay, provider, spec["sizes"], spec["max_tokens"])
    probe = opts.eager_after_replay
    pipelined = mode == "registered"  # step k's collective overlaps step k+1's piece
    kill = spec["kill"]
    hidden = weights.embed.shape[1]
    div = None
    done = timed = captured = 0
    t_eager = t_replay = 0.0
    pending = None  # (index, step, eager output, handle) of the step whose collective is in flight
    flag = torch.zeros(1, dtype=torch.int32)

    def sync():
        provider.synchronize()

    try:
        with torch.inference_mode():
            for k, (step, ids) in enumerate(spec["batches"]):
                progress.mark(case=ci, index=k, step=step, phase="eager")
                if kill is not None and ci == 0 and kill[0] == rank and kill[1] == k:
                    progress.mark(phase=kill[2])
                    if kill[2] == "kill":
                        os.kill(os.getpid(), signal.SIGKILL)
                    while True:
                        time.sleep(3600)
                t0 = time.perf_counter()
                e = eager(input_ids=torch.tensor(ids, dtype=torch.long, device=dev))["out"]
                sync()
                t1 = time.perf_counter()
                progress.mark(phase="replay")
                handle = runner.launch(ids)
                found = None
                if pipelined:
                    if pending is not None:
                        pk, pstep, pe, ph = pending
                        found = _diff(pk, pstep, "out", rank, pe, ph.wait())
                    pending = (k, step, e, handle)
                    sync()
                else:
                    r = handle.wait()
                    sync()
                    found = _diff(k, step, "out", rank, e, r)
                t2 = time.perf_counter()
                if probe:  # every rank, every step: it is a collective
                    progress.mark(phase="eager all-reduce after replay")
                    got, want = eager_all_reduce_probe(group, step, hidden, dev)
                    found = found if found is not None else _diff(k, step, "eager_all_reduce", rank, want, got)
                if runner.captures == captured:  # steady state: steps that captured are not timed
                    t_eager += t1 - t0
                    t_replay += t2 - t1
                    timed += 1
                captured = runner.captures
                done = k + 1
                progress.mark(phase="compare")
                flag.fill_(0 if found is None else 1)
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=control)
                div = found
                if int(flag.item()):
                    break
            else:
                if pending is not None:
                    pk, pstep, pe, ph = pending
                    div = _diff(pk, pstep, "out", rank, pe, ph.wait())
                    sync()
    finally:
        captures, replays = runner.captures, runner.replays
        in_graph = runner.collectives_in_graphs()
        runner.release()
    n = max(timed, 1)
    return {"rank": rank, "steps": done, "first_divergence": div, "eager_us": t_eager / n * 1e6,
            "replay_us": t_replay / n * 1e6, "captures": captures, "replays": replays,
            "collectives_in_graphs": in_graph}

