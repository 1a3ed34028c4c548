"""The persistent batch and its block table on every step of drawn request sequences: the mirror's
`repro.control.input_batch.InputBatch` under the profile's rules against vLLM's `InputBatch` and
`BlockTable` (`repro.upstream.input_batch`), `max_num_seqs` rows each.

Each step, the mirror's `update` (its form of the runner's `_update_states`) runs on the mirror's
batch, and vLLM's batch gets the calls `GPUModelRunner._update_states`
(`vllm/v1/worker/gpu_model_runner.py`) makes, in its order: `remove_request` for every request
not scheduled (finished, preempted, waiting) and for one rescheduled with other blocks (resumed),
which clears its row (`BlockTable.clear_row`); then `add_request` for the new requests in the
step's order, then for the others not in the batch (resumed); then `condense` (which moves rows with
`BlockTable.move_row`) and `refresh_metadata`. Then both commit their rows (`commit_block_table`),
and a FULL dummy run commits its one row where the profile says so. After the update and after each
commit the host table, the committed (device) copy and every request's row are compared; vLLM's
table is wider (`max_num_blocks_per_req`), and its extra columns are compared against the null
block. Sequences with a block size are left out: a growing row is `_update_states`' own
`append_row` of the scheduler's new blocks, which the mirror writes whole.
"""
from __future__ import annotations

import numpy as np

from ..control.input_batch import InputBatch as Mirror
from ..upstream.config import vllm_config
from ..upstream.input_batch import InputBatch
from .result import RuleResult
from ..control.shape import decode_len

RULES = {
    "input batch": ("v1/worker/gpu_input_batch.py: InputBatch.add_request, remove_request, condense; "
                    "v1/worker/block_table.py: BlockTable.add_row, clear_row, move_row, commit_block_table",
                    "repro/control/input_batch.py: InputBatch"),
}


def results() -> dict[str, RuleResult]:
    return {r: RuleResult(r, *RULES[r]) for r in RULES}


def update(theirs: InputBatch, scheduled, seen: set) -> None:
    """`_update_states`' calls on vLLM's batch for one step (module docstring); `seen`: the requests
    scheduled before (a request not in it is new)."""
    now = dict(scheduled)
    rows = theirs.row_of
    for rid in [r for r in rows if r not in now]:
        theirs.remove(rid)
    for rid, blocks in scheduled:
        row = rows.get(rid)
        if row is not None and list(theirs.table[row, :len(blocks)]) != list(blocks):
            theirs.remove(rid)  # resumed with other blocks: `unscheduled_req_ids` holds the resumed ones
    present = theirs.row_of
    new = [(r, b) for r, b in scheduled if r not in present and r not in seen]
    resumed = [(r, b) for r, b in scheduled if r not in present and r in seen]
    for rid, blocks in new + resumed:
        theirs.add(rid, blocks)
    theirs.condense()
    seen.update(now)


def compare_sequence(up, case, seq, rules, out: dict[str, RuleResult]) -> None:
    theirs = InputBatch(up, vllm_config(up, case))
    ours = Mirror(case.max_num_seqs, decode_len(case.spec_tokens), 0, rules)
    r, seen = out["input batch"], set()

    def check(call: str) -> None:
        pad = lambda a: np.concatenate((a, np.zeros((len(a), theirs.width - a.shape[1]), dtype=a.dtype)), 1)
        r.compare(lambda: f"{call} under {case.label()}",
                  {"table": (theirs.table.tolist(), pad(ours.table).tolist()),
                   "committed": (theirs.committed.tolist(), pad(ours.committed).tolist()),
                   "rows": (theirs.row_of, dict(ours.row_of))})

    def commit(n: int, b) -> None:
        ours.commit(n)
        theirs.commit(n)
        check(f"commit({n}) at step {b.step}")

    for b in seq.batches():
        scheduled = list(zip(b.request_ids, b.block_rows()))
        ours.update(scheduled, False, set(b.finished))
        update(theirs, scheduled, seen)
        check(f"step {b.step}'s update (requests {b.request_ids}, finished {b.finished})")
        if b.dummy:
            if rules.dummy_commits_block_table:
                commit(1, b)  # `_dummy_run(1+k)`'s one row
            continue
        commit(ours.num_rows, b)


def run(up, pairs, rules) -> list[RuleResult]:
    """`pairs`: (case, sequence), sequences without a block size (module docstring)."""
    out = results()
    for case, seq in pairs:
        compare_sequence(up, case, seq, rules, out)
    return list(out.values())
