"""Multi-rank runs of the `forced_comm` island: N ranks on one machine, lockstep eager vs replay.

`run_forced_comm(...)` spawns one process a rank (`torch.multiprocessing`, spawn), each in its own
process group. Backends: `gloo` on CPU (the CPU tape records and re-issues the all-reduce), `nccl`
on CUDA (one GPU a rank, CUDA graphs capture the NCCL kernel), `xccl` on XPU (`ccl` where torch
has no XCCL and `oneccl_bindings_for_pytorch` imports). Every rank builds its TP shard of the
island twice, an eager reference and a replay copy run by `SliceRunner` (one graph per padded size),
feeds both the same token-id batches and compares the outputs bit for bit after every step;
per-case results are gathered to rank 0, which writes them once.

Split by concern: `cases.py` (what runs), `supervisor.py` (spawn, watchdog, collect, diagnose,
kill/reap), `rank.py` (one rank's lockstep and the diff).
"""
from __future__ import annotations

from .cases import ISLAND, CommCase, plan, verdict
from .supervisor import GRACE_S, KILL_ENV, run_forced_comm

__all__ = ["GRACE_S", "ISLAND", "KILL_ENV", "CommCase", "exit_code", "format_table", "plan", "run_forced_comm",
           "verdict"]


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
