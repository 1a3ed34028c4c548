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

from ..job import results
from .cases import ISLAND, CommCase, plan
from .supervisor import GRACE_S, KILL_ENV, CommRun, run_forced_comm

__all__ = ["GRACE_S", "ISLAND", "KILL_ENV", "CommCase", "CommRun", "exit_code", "format_table", "plan",
           "run_forced_comm"]


def format_table(res: CommRun) -> str:
    """The shared results table (`repro.job.results`) for a run of `run_forced_comm`."""
    return results.format_table(res.cases, run=res)


def exit_code(res: CommRun, explicit_hazards: bool) -> int:
    """0 clean, 1 divergence or a dead/hung rank, decided by the shared `repro.job.results.exit_code`."""
    return results.exit_code(res.cases, explicit_hazards, run=res)
