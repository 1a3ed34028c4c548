"""Multi-rank runs of the `forced_comm` island: N ranks on one machine, lockstep eager vs replay.

`run_forced_comm(...)` spawns one process a rank (`torch.multiprocessing`, spawn), each in its own
process group. Backends: `gloo` on CPU (the CPU tape records and re-issues the all-reduce), `nccl`
on CUDA (one GPU a rank, CUDA graphs capture the NCCL kernel), `xccl` on XPU (`ccl` where torch
has no XCCL and `oneccl_bindings_for_pytorch` imports). Every rank builds its TP shard of the
island twice, an eager reference and a replay copy run by `SliceRunner` (one graph per padded size),
feeds both the same token-id batches and compares the outputs bit for bit after every step. A
divergence on any rank stops every rank at that step (a MAX all-reduce of a flag on a separate
gloo group, so control traffic never touches the communicator under test); per-case results are
gathered to rank 0, which writes them once.

A run never hangs the caller. Process-group init and every collective carry a timeout; each rank
writes where it is (case, step, phase) to a progress file; the parent enforces a deadline, gives
the other ranks a short grace once one has failed, then kills whatever is left (the rank's whole
process group) and reports which rank died, hung or failed, and where. Children exit on their own
if the parent disappears. Graphs are released before `destroy_process_group()` (on H200s it hangs
while a graph holding a captured collective is alive).

Test hook: `kill_rank=(rank, step)` makes that rank SIGKILL itself at that step index of the first
case; `(rank, step, "hang")` makes it stop answering instead. The CLI reads
`REPRO_FORCED_COMM_KILL=rank:step[:hang]`.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass

import torch

from . import hazards as hz
from .errors import BadInput, DeviceUnavailable

ISLAND = "forced_comm"
KILL_ENV = "REPRO_FORCED_COMM_KILL"
GRACE_S = 5.0  # once a rank has failed, how long the others get to notice and report


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class CommCase:
    hazards: tuple[str, ...] = ()
    repairs: tuple[str, ...] = ()

    @property
    def mode(self) -> str:
        from .islands.forced_comm import comm_mode_for
        return comm_mode_for(self.hazards, self.repairs)

    @property
    def expect(self) -> str:
        """What a healthy stack gives. comm-graph-then-eager has no repair: clean on gloo/NCCL, and
        a divergence is the upstream bug to report (PyTorch 189403 on XPU)."""
        return hz.expectation(self.hazards, self.repairs)

    def label(self) -> str:
        return ",".join(self.hazards) or "baseline"


def _default_plan() -> list[CommCase]:
    """Baseline, then each of the slice's hazards alone, without and with its first repair."""
    cases = [CommCase()]
    for h in hz.planted("piecewise", True, ISLAND):
        cases.append(CommCase((h.name,)))
        if h.repairs:
            cases.append(CommCase((h.name,), (h.repairs[0],)))
    return cases


def plan(hazards=(), repairs=()) -> list[CommCase]:
    """Explicit knobs -> that one case; none -> baseline and every hazard with and without its repair."""
    cases = [CommCase(tuple(hazards), tuple(repairs))] if (hazards or repairs) else _default_plan()
    for c in cases:
        c.mode  # noqa: B018  (refuses knobs forced_comm cannot honour)
    return cases


def verdict(r: dict) -> str:
    if r.get("expect") == "diverged":
        return "detected" if r["diverged"] else "MISSED"
    return "DIVERGED" if r["diverged"] else "ok"


# --------------------------------------------------------------------------- device and backend


def _device_kind(device: str) -> str:
    from .graphs import resolve_device
    return resolve_device(device).split(":")[0]


def _backend(kind: str, forced: str | None = None) -> str:
    """The process-group backend for a device kind (`forced`: the caller's choice, e.g. the CLI's
    $REPRO_COMM_BACKEND)."""
    import torch.distributed as dist

    if forced:
        return forced
    if kind == "cpu":
        return "gloo"
    if kind == "cuda":
        if not dist.is_nccl_available():
            raise DeviceUnavailable("--device cuda: this torch has no NCCL")
        return "nccl"
    if getattr(dist, "is_xccl_available", lambda: False)():
        return "xccl"
    try:
        import oneccl_bindings_for_pytorch  # noqa: F401
        return "ccl"
    except Exception as e:  # pragma: no cover - only on XPU stacks
        raise DeviceUnavailable(f"--device xpu: torch has no XCCL (torch >= 2.8) and oneccl_bindings_for_pytorch "
                                f"does not import ({e})") from e


def _check_devices(kind: str, tp: int) -> None:
    if kind == "cpu":
        return
    mod = torch.cuda if kind == "cuda" else getattr(torch, "xpu", None)
    have = mod.device_count() if mod is not None and mod.is_available() else 0
    if have < tp:
        raise DeviceUnavailable(f"--tp {tp} on {kind} needs {tp} devices (one a rank), found {have}")


# --------------------------------------------------------------------------- the parent


def run_forced_comm(checkpoint=None, tp: int = 2, device: str = "cpu", hazards=(), repairs=(), steps: int = 40,
                    seed: int = 0, timeout: float = 300.0, layer: int = 0, comm_dtype: str = "auto",
                    cases=None, sizes=None, kill_rank=None, collective_timeout: float | None = None,
                    batches=None, backend: str | None = None) -> dict:
    """Run the forced_comm cases on `tp` ranks; returns the result object (DESIGN.md's JSON contract
    plus `failure` and `pids`). `cases`: an explicit list of `CommCase` (or (hazards, repairs)
    pairs) run in one launch; default: `plan(hazards, repairs)`. `batches`: a list of
    `StepBatch` (default: a seeded random request sequence cut to `steps` steps)."""
    from .checkpoint import Checkpoint
    from .islands.forced_comm import COMM_DTYPES, DEFAULT_SIZES, DEFAULT_VOCAB
    from .sequence import random_sequence

    if not isinstance(tp, int) or tp < 2:
        raise BadInput(f"forced_comm needs --tp >= 2 (one rank a shard), got {tp}")
    if comm_dtype not in COMM_DTYPES:
        raise BadInput(f"unknown comm dtype {comm_dtype!r} (choose from {', '.join(COMM_DTYPES)})")
    if cases is None:
        cases = plan(hazards, repairs)
    else:
        cases = [c if isinstance(c, CommCase) else CommCase(tuple(c[0]), tuple(c[1])) for c in cases]
        for c in cases:
            c.mode  # noqa: B018
    if checkpoint is None:
        from .tiny import default_checkpoint
        checkpoint = default_checkpoint()
    ck = Checkpoint.open(checkpoint)
    cfg = ck.config
    layer = 0 if layer is None else layer
    if not 0 <= layer < cfg.num_hidden_layers:
        raise BadInput(f"--layer {layer} is not a layer of {checkpoint} (0..{cfg.num_hidden_layers - 1})")
    if cfg.shared_expert_intermediate_size % tp:
        raise BadInput(f"--tp {tp} does not divide the shared expert's intermediate size "
                       f"{cfg.shared_expert_intermediate_size}")
    kind = _device_kind(device)
    _check_devices(kind, tp)
    backend = _backend(kind, backend)
    vocab = min(cfg.vocab_size, DEFAULT_VOCAB)
    if batches is None:
        seq = random_sequence(seed, num_requests=max(2, steps // 6), vocab=vocab)
        batches = seq.batches()[:steps]
    for b in batches:
        if any(not 0 <= t < vocab for t in b.token_ids):
            raise BadInput(f"step {b.step}: token ids must be in 0..{vocab - 1} (the embedding rows loaded)")
    sizes = tuple(sizes or DEFAULT_SIZES)
    timeout = float(timeout)
    coll_timeout = float(collective_timeout or max(5.0, min(60.0, timeout / 2)))
    if kill_rank is not None:
        kill_rank = tuple(kill_rank) + (("kill",) if len(kill_rank) == 2 else ())
        if not (0 <= kill_rank[0] < tp and kill_rank[2] in ("kill", "hang")):
            raise BadInput(f"kill_rank {kill_rank!r}: (rank in 0..{tp - 1}, step[, 'kill'|'hang'])")

    outdir = tempfile.mkdtemp(prefix="repro-forced-comm-")
    spec = {
        "checkpoint": str(checkpoint), "layer": layer, "tp": tp, "kind": kind, "backend": backend,
        "init": "file://" + os.path.join(outdir, "store"), "outdir": outdir, "timeout_s": coll_timeout,
        "cases": [(list(c.hazards), list(c.repairs)) for c in cases], "comm_dtype": comm_dtype,
        "batches": [(b.step, list(b.token_ids)) for b in batches], "sizes": sizes, "vocab": vocab,
        "max_tokens": max([len(b.token_ids) for b in batches] + [sizes[-1]]), "kill": kill_rank,
        "threads": max(1, (os.cpu_count() or 1) // tp) if kind == "cpu" else 4,
    }
    t0 = time.monotonic()
    ctx = torch.multiprocessing.get_context("spawn")
    procs = []
    try:
        with _main_not_reimported():
            for r in range(tp):
                p = ctx.Process(target=_rank_main, args=(r, spec), name=f"forced_comm-rank{r}", daemon=True)
                p.start()
                procs.append(p)
        status = _watch(procs, t0 + timeout)
        info = _collect(outdir, procs, status, cases, spec, time.monotonic() - t0, timeout)
    finally:
        leftover = _reap(procs)
        shutil.rmtree(outdir, ignore_errors=True)
    info["pids"] = [p.pid for p in procs]
    info["leftover"] = leftover
    if leftover and info.get("failure") is None:
        info["failure"] = {"kind": "leftover", "detail": f"processes {leftover} survived the run"}
    info["diverged"] = bool(info.get("failure")) or any(r["diverged"] for r in info["results"])
    return info


@contextlib.contextmanager
def _main_not_reimported():
    """Ranks need nothing from `__main__` (their entry point is this module), so hide it from spawn:
    a caller's script without an `if __name__ == "__main__"` guard (a bug report's standalone
    script, say) is then not re-run in every rank."""
    main = sys.modules.get("__main__")
    saved = {k: getattr(main, k) for k in ("__file__", "__spec__") if main is not None and hasattr(main, k)}
    try:
        for k in saved:
            if k == "__file__":
                delattr(main, k)
            else:
                setattr(main, k, None)
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


def _watch(procs, deadline: float) -> dict:
    """Wait for every rank; after the first failure give the others GRACE_S, at the deadline stop."""
    exit_at: dict[int, float] = {}
    grace_until = None
    while True:
        now = time.monotonic()
        for r, p in enumerate(procs):
            if r not in exit_at and p.exitcode is not None:
                exit_at[r] = now
        if len(exit_at) == len(procs):
            return {"exit_at": exit_at, "killed": [], "deadline": False}
        if grace_until is None and any(procs[r].exitcode != 0 for r in exit_at):
            grace_until = now + GRACE_S
        if now >= deadline or (grace_until is not None and now >= grace_until):
            alive = [r for r in range(len(procs)) if r not in exit_at]
            for r in alive:
                _kill(procs[r])
            for r in alive:
                procs[r].join(timeout=5)
            return {"exit_at": exit_at, "killed": alive, "deadline": now >= deadline}
        time.sleep(0.05)


def _kill(p) -> None:
    """SIGKILL a rank's whole process group (it made itself a group leader), then the rank itself."""
    if p.pid is None:
        return
    try:
        if os.getpgid(p.pid) == p.pid:
            os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    if p.exitcode is None:
        p.kill()


def _reap(procs) -> list[int]:
    """Kill anything still alive, join everything, and return the pids (or process groups) that remain."""
    for p in procs:
        if p.pid is not None and p.exitcode is None:
            _kill(p)
    for p in procs:
        if p.pid is not None:
            p.join(timeout=10)
    left = []
    for p in procs:
        if p.pid is None:
            continue
        for probe in (os.kill, os.killpg):
            try:
                probe(p.pid, 0)
                left.append(p.pid)
                break
            except ProcessLookupError:
                pass
            except PermissionError:
                left.append(p.pid)
                break
    return left


def _read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _collect(outdir, procs, status, cases, spec, elapsed: float, timeout: float) -> dict:
    meta = {"island": ISLAND, "tp": spec["tp"], "backend": spec["backend"], "device": spec["kind"],
            "graph_provider": "cpu-tape" if spec["kind"] == "cpu" else spec["kind"], "torch": torch.__version__,
            "checkpoint": spec["checkpoint"], "layer": spec["layer"], "comm_dtype": spec["comm_dtype"],
            "elapsed_s": round(elapsed, 2)}
    result = _read_json(os.path.join(outdir, "result.json"))
    codes = [p.exitcode for p in procs]
    if result is not None and all(c == 0 for c in codes):
        meta.update({k: result[k] for k in ("device", "graph_provider") if k in result})
        return {**meta, "results": result["results"], "failure": None}
    ranks = {}
    for r, p in enumerate(procs):
        prog = _read_json(os.path.join(outdir, f"progress.{r}.json")) or {}
        err = None
        try:
            with open(os.path.join(outdir, f"error.{r}.txt")) as f:
                err = f.read()
        except OSError:
            pass
        if r in status["killed"]:
            state = "hung"
        elif p.exitcode is not None and p.exitcode < 0:
            state = "died"
        elif p.exitcode:
            state = "error"
        else:
            state = "ok"
        ranks[r] = {"state": state, "exitcode": p.exitcode, "signal": -p.exitcode if (p.exitcode or 0) < 0 and
                    state == "died" else None, "last": prog, "error": err.strip().splitlines()[-1] if err else None,
                    "traceback": err}
    failure = _diagnose(ranks, status, spec, timeout)
    # what rank 0 had written of per-case results before the failure (none: the case list, not run)
    results = [_case_json(c, None) for c in cases]
    return {**meta, "results": results, "failure": failure}


def _diagnose(ranks: dict, status: dict, spec, timeout: float) -> dict:
    """Name the rank at fault: one that died (a signal we did not send), else one that hung (still
    alive when another timed out or the deadline passed), else the first that raised."""
    exit_at = status["exit_at"]
    died = sorted((r for r, v in ranks.items() if v["state"] == "died"), key=lambda r: exit_at.get(r, 0))
    hung = [r for r, v in ranks.items() if v["state"] == "hung"]
    errs = sorted((r for r, v in ranks.items() if v["state"] == "error"), key=lambda r: exit_at.get(r, 0))
    if died:
        r, kind = died[0], "died"
        detail = f"rank {r} died (signal {ranks[r]['signal']})"
    elif hung:
        r = min(hung, key=lambda q: (ranks[q]["last"].get("case", 0), ranks[q]["last"].get("index", 0)))
        kind = "hung"
        why = (f"the {timeout:.0f} s deadline passed" if status["deadline"] else
               f"rank {errs[0]} gave up: {ranks[errs[0]]['error']}" if errs else "killed")
        where = ", ".join(f"rank {q} at step {ranks[q]['last'].get('step')} ({ranks[q]['last'].get('phase')})"
                          for q in hung)
        detail = f"rank {r} stopped answering ({why}); killed: {where}"
    elif errs:
        r, kind = errs[0], "error"
        detail = f"rank {r} failed: {ranks[r]['error']}"
    else:
        r, kind, detail = 0, "error", "rank 0 wrote no result"
    last = ranks[r]["last"]
    cases = spec["cases"]
    case = cases[last["case"]] if "case" in last and last["case"] < len(cases) else None
    return {"kind": kind, "rank": r, "step": last.get("step"), "index": last.get("index"),
            "phase": last.get("phase"), "case": None if case is None else {"hazards": case[0], "repairs": case[1]},
            "detail": detail, "ranks": ranks, "timeout_s": timeout}


def _case_json(c: CommCase, merged: dict | None) -> dict:
    m = merged or {}
    r = {"island": ISLAND, "comm_mode": c.mode, "hazards": list(c.hazards), "repairs": list(c.repairs),
         "steps": m.get("steps", 0), "diverged": bool(m.get("first_divergence")),
         "first_divergence": m.get("first_divergence"), "ranks_diverged": m.get("ranks_diverged", []),
         "expect": c.expect, "eager_us": m.get("eager_us", 0.0), "replay_us": m.get("replay_us", 0.0),
         "captures": m.get("captures", 0), "replays": m.get("replays", 0),
         "collectives_in_graphs": m.get("collectives_in_graphs")}
    r["verdict"] = verdict(r) if merged is not None else "not run"
    return r


# --------------------------------------------------------------------------- a rank


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
    except BaseException:  # noqa: BLE001 - everything is reported to the parent
        code = 1
        with open(os.path.join(spec["outdir"], f"error.{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: a wedged communicator must not hold the exit


def _rank_run(rank: int, spec: dict, progress: _Progress) -> None:
    import torch.distributed as dist

    from .graphs import make_provider
    from .islands.forced_comm import load_slice

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
            out = {"device": _device_name(dev), "graph_provider": provider.name,
                   "results": [_case_json(c, _merge([g[i] for g in gathered])) for i, c in enumerate(cases)]}
            tmp = os.path.join(spec["outdir"], "result.json.tmp")
            with open(tmp, "w") as f:
                json.dump(out, f)
            os.replace(tmp, os.path.join(spec["outdir"], "result.json"))
        progress.mark(phase="teardown")
        dist.barrier(group=control)
    finally:
        import gc
        gc.collect()  # graphs are gone (each case released its own) before the group is torn down
        dist.destroy_process_group()
    progress.mark(phase="done")


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    if dev.type == "xpu":
        return torch.xpu.get_device_name(dev)
    return "cpu"


def _merge(per_rank: list[dict]) -> dict:
    divs = [d["first_divergence"] for d in per_rank if d["first_divergence"]]
    first = min(divs, key=lambda d: (d["index"], d["rank"])) if divs else None
    n = len(per_rank)
    return {"steps": max(d["steps"] for d in per_rank), "first_divergence": first,
            "ranks_diverged": sorted(d["rank"] for d in divs),
            "eager_us": round(sum(d["eager_us"] for d in per_rank) / n, 1),
            "replay_us": round(sum(d["replay_us"] for d in per_rank) / n, 1),
            "captures": per_rank[0]["captures"], "replays": per_rank[0]["replays"],
            "collectives_in_graphs": per_rank[0]["collectives_in_graphs"]}


def _diff(index: int, step: int, tensor: str, rank: int, eager: torch.Tensor, replay: torch.Tensor) -> dict | None:
    """None when bit-identical (NaN matching NaN), else where and how much they differ."""
    a, b = eager.detach().cpu(), replay.detach().cpu()
    if a.shape != b.shape:
        return {"index": index, "step": step, "island": ISLAND, "tensor": tensor, "row": None, "rank": rank,
                "max_abs": float("inf"), "detail": f"shape {tuple(a.shape)} vs {tuple(b.shape)}"}
    same = (a == b) | (torch.isnan(a.float()) & torch.isnan(b.float()))
    if bool(same.all()):
        return None
    rows = ~same.reshape(same.shape[0], -1).all(-1)
    d = torch.nan_to_num((a.float() - b.float()).abs(), nan=float("inf"))
    return {"index": index, "step": step, "island": ISLAND, "tensor": tensor, "row": int(rows.int().argmax()),
            "rank": rank, "max_abs": float(d.max())}


def _run_case(rank, ci, case: CommCase, weights, provider, group, control, spec, progress) -> dict:
    import torch.distributed as dist

    from .islands.forced_comm import Communicator, ForcedComm, SliceRunner, eager_all_reduce_probe, resolve_comm_dtype

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
                    found = found or _diff(k, step, "eager_all_reduce", rank, want, got)
                if runner.captures == captured:  # steady state: steps that captured are not timed
                    t_eager += t1 - t0
                    t_replay += t2 - t1
                    timed += 1
                captured = runner.captures
                done = k + 1
                progress.mark(phase="compare")
                flag.fill_(1 if found else 0)
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


# --------------------------------------------------------------------------- the command line


def format_table(res: dict) -> str:
    rows = [("island", "comm mode", "hazard", "repair", "steps", "result", "first divergence", "replay/eager")]
    for r in res["results"]:
        fd = r["first_divergence"]
        where = (f"step {fd['step']} rank {fd['rank']} {fd['tensor']} row {fd['row']} |d|={fd['max_abs']:.3g}"
                 if fd else "")
        ratio = f"{r['replay_us'] / r['eager_us']:.2f}" if r["eager_us"] else "-"
        rows.append((ISLAND, r["comm_mode"], ",".join(r["hazards"]) or "-", ",".join(r["repairs"]) or "-",
                     str(r["steps"]), r["verdict"], where, ratio))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    f = res.get("failure")
    if f:
        where = f"case {f['case']}, step {f['step']}, {f['phase']}" if f.get("case") else f"phase {f.get('phase')}"
        lines.append(f"FAILED: {f['kind']}: {f['detail']} (at {where})")
    lines.append(f"tp {res['tp']} over {res['backend']} on {res['device']}, provider {res['graph_provider']}, "
                 f"comm dtype {res['comm_dtype']}, {res['elapsed_s']:.1f} s")
    return "\n".join(lines)


def exit_code(res: dict, explicit_hazards: bool) -> int:
    """0 clean, 1 divergence or a dead/hung rank (DESIGN.md's contract, as `repro run` decides it)."""
    if res.get("failure"):
        return 1
    if any(r["diverged"] for r in res["results"] if r["expect"] == "clean"):
        return 1
    if explicit_hazards and any(r["diverged"] for r in res["results"]):
        return 1
    return 0
