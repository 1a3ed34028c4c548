"""The forced_comm supervisor: validate, spawn one process a rank, watch them, collect, diagnose.

A run never hangs the caller. Process-group init and every collective carry a timeout; each rank
writes where it is (case, step, phase) to a progress file; the parent enforces a deadline, gives
the other ranks a short grace once one has failed, then kills whatever is left (the rank's whole
process group) and reports which rank died, hung or failed, and where. Children exit on their own
if the parent disappears (`rank.py`).

Test hook: `kill_rank=(rank, step)` makes that rank SIGKILL itself at that step index of the first
case; `(rank, step, "hang")` makes it stop answering instead. The CLI reads
`REPRO_FORCED_COMM_KILL=rank:step[:hang]` (`KILL_ENV`) and passes it here.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time

import torch

from ..errors import BadInput, DeviceUnavailable
from ..job.results import MultiRankResult
from .cases import ISLAND, CommCase, plan
from .rank import _rank_main
from ..graphs import resolve_device
from ..model.checkpoint import Checkpoint
from ..control.dispatch import DEFAULT_SIZES
from ..islands.forced_comm import COMM_DTYPES, DEFAULT_VOCAB
from ..scheduler.sequence import random_sequence
from ..model.tiny import default_checkpoint

KILL_ENV = "REPRO_FORCED_COMM_KILL"
GRACE_S = 5.0  # once a rank has failed, how long the others get to notice and report

# --------------------------------------------------------------------------- device and backend


def _device_kind(device: str) -> str:
    return resolve_device(device).split(":")[0]


def _backend(kind: str, forced: str | None = None) -> str:
    """The process-group backend for a device kind (`forced`: the caller's choice, e.g. the CLI's
    $REPRO_COMM_BACKEND)."""
    import torch.distributed as dist

    if forced:
        _check_forced(forced, kind)
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
        importlib.import_module("oneccl_bindings_for_pytorch")  # registers the "ccl" backend
        return "ccl"
    except Exception as e:  # pragma: no cover - only on XPU stacks
        raise DeviceUnavailable(f"--device xpu: torch has no XCCL (torch >= 2.8) and oneccl_bindings_for_pytorch "
                                f"does not import ({e})") from e


# The device each forced backend's collectives run on ("ccl": oneCCL's bindings, CPU or XPU).
_BACKEND_DEVICES = {"gloo": ("cpu", "cuda", "xpu"), "nccl": ("cuda",), "xccl": ("xpu",), "ccl": ("cpu", "xpu")}


def _check_forced(backend: str, kind: str) -> None:
    """A forced backend (the CLI's $REPRO_COMM_BACKEND) that cannot run the ranks' device is bad
    input, refused before any rank starts (else every rank fails in `init_process_group`)."""
    import torch.distributed as dist

    where = _BACKEND_DEVICES.get(backend, ())
    if kind not in where:
        raise DeviceUnavailable(f"comm backend {backend!r} (REPRO_COMM_BACKEND) runs on {' or '.join(where) or '?'}, "
                                f"and the ranks run on {kind} (--device)")
    if backend == "nccl" and not dist.is_nccl_available():
        raise DeviceUnavailable("comm backend 'nccl' (REPRO_COMM_BACKEND): this torch has no NCCL")
    if backend == "xccl" and not getattr(dist, "is_xccl_available", lambda: False)():
        raise DeviceUnavailable("comm backend 'xccl' (REPRO_COMM_BACKEND): this torch has no XCCL (torch >= 2.8 +xpu)")
    if backend == "ccl":
        try:
            importlib.import_module("oneccl_bindings_for_pytorch")  # registers the "ccl" backend
        except Exception as e:
            raise DeviceUnavailable(f"comm backend 'ccl' (REPRO_COMM_BACKEND): oneccl_bindings_for_pytorch does not "
                                    f"import ({e})") from None


def _check_devices(kind: str, tp: int) -> None:
    if kind == "cpu":
        return
    mod = torch.cuda if kind == "cuda" else getattr(torch, "xpu", None)
    have = mod.device_count() if mod is not None and mod.is_available() else 0
    if have < tp:
        raise DeviceUnavailable(f"--tp {tp} on {kind} needs {tp} devices (one a rank), found {have}")


# --------------------------------------------------------------------------- the parent


class CommRun(dict):
    """A run's result: the JSON object itself (DESIGN.md's contract plus `failure` and `pids`), a
    plain dict to callers and to the JSON writer, and `cases`, the `MultiRankResult` objects its
    "results" rows were written from. The shared verdict, table and exit code read `cases`, so
    nothing is rebuilt from the rows."""

    def __init__(self, meta: dict, cases: list[MultiRankResult], failure: dict | None):
        super().__init__(meta, results=[r.to_json() for r in cases], failure=failure)
        self.cases = cases


def run_forced_comm(checkpoint=None, tp: int = 2, device: str = "cpu", hazards=(), repairs=(), steps: int = 40,
                    seed: int = 0, timeout: float = 300.0, layer: int = 0, comm_dtype: str = "auto",
                    cases=None, sizes=None, kill_rank=None, collective_timeout: float | None = None,
                    batches=None, backend: str | None = None) -> CommRun:
    """Run the forced_comm cases on `tp` ranks; returns the result object (DESIGN.md's JSON contract
    plus `failure` and `pids`). `cases`: an explicit list of `CommCase` (or (hazards, repairs)
    pairs) run in one launch; default: `plan(hazards, repairs)`. `batches`: a list of
    `StepBatch` (default: a seeded random request sequence cut to `steps` steps)."""

    if not isinstance(tp, int) or tp < 2:
        raise BadInput(f"forced_comm needs --tp >= 2 (one rank a shard), got {tp}")
    if comm_dtype not in COMM_DTYPES:
        raise BadInput(f"unknown comm dtype {comm_dtype!r} (choose from {', '.join(COMM_DTYPES)})")
    cases = plan(hazards, repairs) if cases is None else _checked_cases(cases)
    if checkpoint is None:
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
    return _launch(spec, cases, tp, timeout)


def _checked_cases(cases) -> list[CommCase]:
    """An explicit list of cases as `CommCase`s, refused here (`CommCase.mode`) if forced_comm cannot
    honour its knobs."""
    cases = [c if isinstance(c, CommCase) else CommCase(tuple(c[0]), tuple(c[1])) for c in cases]
    for c in cases:
        c.mode
    return cases


def _launch(spec: dict, cases: list[CommCase], tp: int, timeout: float) -> CommRun:
    """Spawn the `tp` ranks on `spec`, watch them to the end (or `timeout`), reap every one, and read
    the result they wrote."""
    outdir, t0 = spec["outdir"], time.monotonic()
    ctx = torch.multiprocessing.get_context("spawn")
    procs = []
    try:
        with _main_not_reimported():
            for r in range(tp):
                p = ctx.Process(target=_rank_main, args=(r, spec), name=f"forced_comm-rank{r}", daemon=True)
                p.start()
                procs.append(p)
        status = _watch(procs, t0 + timeout, outdir)
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
    """Ranks need nothing from `__main__` (their entry point is `rank.py`), so hide it from spawn:
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


HEARTBEAT_S = 10.0  # a line on stderr this often while ranks run: a hung rank is never silent


def _heartbeat(outdir: str, n: int, t0: float) -> str:
    """Where each rank is (its progress file): case, step index and phase."""
    where = []
    for r in range(n):
        st = _read_json(os.path.join(outdir, f"progress.{r}.json")) or {}
        where.append(f"rank {r}: case {st.get('case', '-')} step {st.get('index', '-')} {st.get('phase', 'starting')}")
    return f"repro: forced_comm: {time.monotonic() - t0:.0f} s; " + "; ".join(where)


def _watch(procs, deadline: float, outdir: str | None = None) -> dict:
    """Wait for every rank; after the first failure give the others GRACE_S, at the deadline stop.
    With `outdir`, say where the ranks are every HEARTBEAT_S on stderr."""
    exit_at: dict[int, float] = {}
    grace_until = None
    start = last = time.monotonic()
    while True:
        now = time.monotonic()
        if outdir is not None and now - last >= HEARTBEAT_S:
            last = now
            print(_heartbeat(outdir, len(procs), start), file=sys.stderr, flush=True)
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


def _read_pickle(path):
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def _collect(outdir, procs, status, cases, spec, elapsed: float, timeout: float) -> CommRun:
    meta = {"island": ISLAND, "tp": spec["tp"], "backend": spec["backend"], "device": spec["kind"],
            "graph_provider": "cpu-tape" if spec["kind"] == "cpu" else spec["kind"], "torch": torch.__version__,
            "checkpoint": spec["checkpoint"], "layer": spec["layer"], "comm_dtype": spec["comm_dtype"],
            "elapsed_s": round(elapsed, 2)}
    result = _read_pickle(os.path.join(outdir, "result.pkl"))  # written by rank 0 (`rank.py`)
    codes = [p.exitcode for p in procs]
    if result is not None and all(c == 0 for c in codes):
        meta.update({k: result[k] for k in ("device", "graph_provider") if k in result})
        return CommRun(meta, result["results"], None)
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
    results = [MultiRankResult(c, 0, None, ran=False) for c in cases]
    return CommRun(meta, results, failure)


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

