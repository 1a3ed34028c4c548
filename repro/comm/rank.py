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
from ..control.shape import decode_len

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

    eager, runner, opts = _copies(rank, case, weights, provider, group, spec)
    probe = opts.eager_after_replay
    pipelined = case.mode == "registered"  # step k's collective overlaps step k+1's piece
    hidden, dev = weights.embed.shape[1], weights.embed.device
    div = None
    done = 0
    clock = _SteadyClock()
    pending = None  # (index, step, eager output, handle) of the step whose collective is in flight
    flag = torch.zeros(1, dtype=torch.int32)

    try:
        with torch.inference_mode():
            for k, (step, ids) in enumerate(spec["batches"]):
                progress.mark(case=ci, index=k, step=step, phase="eager")
                if spec["kill"] is not None and ci == 0:
                    _fail_if_told(spec["kill"], rank, k, progress)
                t0 = time.perf_counter()
                e = eager(input_ids=torch.tensor(ids, dtype=torch.long, device=dev))["out"]
                provider.synchronize()
                t1 = time.perf_counter()
                progress.mark(phase="replay")
                found, pending = _replay(runner, provider, rank, k, step, ids, e, pending if pipelined else False)
                t2 = time.perf_counter()
                if probe:  # every rank, every step: it is a collective
                    progress.mark(phase="eager all-reduce after replay")
                    got, want = eager_all_reduce_probe(group, step, hidden, dev)
                    found = found if found is not None else _diff(k, step, "eager_all_reduce", rank, want, got)
                clock.add(runner.captures, t1 - t0, t2 - t1)
                done = decode_len(k)
                progress.mark(phase="compare")
                flag.fill_(0 if found is None else 1)
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=control)
                div = found
                if int(flag.item()):
                    break
            else:
                if pending:
                    pk, pstep, pe, ph = pending
                    div = _diff(pk, pstep, "out", rank, pe, ph.wait())
                    provider.synchronize()
    finally:
        captures, replays = runner.captures, runner.replays
        in_graph = runner.collectives_in_graphs()
        runner.release()
    return {"rank": rank, "steps": done, "first_divergence": div, "eager_us": clock.mean_us(clock.eager),
            "replay_us": clock.mean_us(clock.replay), "captures": captures, "replays": replays,
            "collectives_in_graphs": in_graph}


def _copies(rank, case: CommCase, weights, provider, group, spec) -> tuple:
    """The eager forced_comm slice, the graph runner over its replayed copy, and the case's comm options."""
    tp = spec["tp"]
    opts = hz.options_for(case.hazards, case.repairs).comm
    eager = ForcedComm(weights, Communicator(group, resolve_comm_dtype(spec["comm_dtype"], tp)), "in-graph",
                       max_tokens=spec["max_tokens"])
    replay = ForcedComm.build(None, tp_rank=rank, tp_size=tp, group=group, mode=case.mode, comm_dtype=spec["comm_dtype"],
                              clone_input=opts.clone_input, max_tokens=spec["max_tokens"],
                              weights=weights, noop_capture=opts.noop_capture)
    return eager, SliceRunner(replay, provider, spec["sizes"], spec["max_tokens"]), opts


def _fail_if_told(kill, rank, k: int, progress) -> None:
    """The failure a test asks of this rank at step `k` (`kill`: (rank, step, "kill" | "hang")): die, or hang."""
    if kill[0] == rank and kill[1] == k:
        progress.mark(phase=kill[2])
        if kill[2] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:
            time.sleep(3600)


def _replay(runner, provider, rank, k: int, step: int, ids, e, pending):
    """Launch step `k`'s replay and compare with the eager output `e`: at once, or (`pending` not False:
    the registered mode, pipelined) the step in flight before it. Returns the divergence found (or None)
    and the step now in flight."""
    handle = runner.launch(ids)
    found = None
    if pending is False:
        r = handle.wait()
        provider.synchronize()
        return _diff(k, step, "out", rank, e, r), False
    if pending is not None:
        pk, pstep, pe, ph = pending
        found = _diff(pk, pstep, "out", rank, pe, ph.wait())
    provider.synchronize()
    return found, (k, step, e, handle)


class _SteadyClock:
    """The eager and replay seconds summed over steady-state steps (a step that captured is not timed)."""

    def __init__(self):
        self.eager = self.replay = 0.0
        self.timed = self.captured = 0

    def add(self, captures: int, eager: float, replay: float) -> None:
        if captures == self.captured:
            self.eager += eager
            self.replay += replay
            self.timed += 1
        self.captured = captures

    def mean_us(self, total: float) -> float:
        return total / max(self.timed, 1) * 1e6

