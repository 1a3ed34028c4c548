"""The steps a case runs, and the state blocks its copies need: the mirror's scheduler
(`repro.scheduler`), or under a vLLM control source (`--control vllm`, `vllm-v2`) vLLM's own V1
scheduler driven by the sequence (`repro.upstream.schedule`: requests added at arrival, the
sequence's kept counts and preemptions, vLLM's chunks, resumes and placeholder drafts). A sequence
with recorded steps (a saved hunt, a `--sequence` file) replays them as recorded, whoever scheduled
them. Async scheduling and the other data-parallel rank's batches are the mirror's alone
(`repro/scheduler/config.py`, `control.dispatch.dispatch_step`): vLLM's scheduler runs synchronously,
for this rank alone. vLLM's block ids run up to its pool's size, so the copies' state caches are sized to the
largest id the steps hold."""
from __future__ import annotations

from dataclasses import replace

from ..control.batch import StepBatch
from ..errors import BadInput
from ..scheduler.sequence import Sequence
from ..scheduler.tokens import draft, token
from ..upstream.load import load
from ..upstream.schedule import schedule
from ..control.shape import decode_len


def case_steps(case, seq: Sequence, usable=None) -> list[StepBatch]:
    """The case's steps (module docstring); `usable`: the mirror's usable slots (a -1 sentinel)."""
    if case.control.upstream and any(st.get("dp_peer") for st in seq.steps):
        raise BadInput("recorded steps agreed with another data-parallel rank's batch (dp_peer) replay on the mirror "
                       "only: vLLM's coordinate_batch_across_dp needs its data-parallel group")
    if not case.control.upstream or seq.steps:
        return seq.batches(usable)
    # vLLM's scheduler runs synchronously and for this rank alone here (its AsyncScheduler's one-step lag
    # and the data-parallel agreement are not driven): a sequence's async setting and other rank are the
    # mirror's alone
    return schedule(load(), replace(seq, async_scheduling=False, dp_peers=None), token, draft, mode=case.mode)


def copy_slots(seq: Sequence, batches: list[StepBatch]) -> int:
    """The `num_slots` a layer copy needs for `batches`: the sequence's own, or more where a step
    holds a larger block id (vLLM's pool: block b needs ceil(b / (1+K)) slots of 1+K blocks)."""
    top = max((b for s in batches for row in s.block_rows() for b in row), default=0)
    return max(seq.copy_slots(), -(-top // decode_len(seq.spec_tokens)))
