"""The runner's persistent batch: a row per request and the block table of their state blocks
(`vllm/v1/worker/gpu_input_batch.py: InputBatch`, `vllm/v1/worker/block_table.py: BlockTable`).

Rows outlive requests: a finished request leaves a hole, a new one takes the lowest hole, and
`condense()` moves the last live rows into the lowest holes. What a vacated or finished row still
holds is what a dummy run reads when it builds metadata for rows past the live ones, so the two
rules that clear them are `ControlRules` settings: `BlockTable.clear_row` when a request finishes
(`InputBatch.remove_request`, vLLM #37728) and `BlockTable.move_row` zeroing the row it moved
(vLLM #49757). The table lives on the host; `commit(n)` copies its first n rows to the copy the
device reads (`commit_block_table`), whose other rows keep what they held.

With prefix caching's block size (`control.prefix`) a request's row grows with its sequence and
its retired columns turn null: a request that stays in the batch has its row rewritten in place
(`BlockTable.append_row` for the new columns), and the table widens when a row needs more columns
than it has (vLLM sizes it for the longest sequence up front: `max_num_blocks_per_req`).
"""
from __future__ import annotations

import numpy as np

from ..knobs.options import ControlRules


class InputBatch:
    """Rows and the block table of one runner (module docstring). `null` is the block id an empty
    entry holds (the kernels' pad sentinel); `width` the blocks a request holds."""

    def __init__(self, max_reqs: int, width: int, null: int, rules: ControlRules = ControlRules()):
        self.rules, self.null = rules, null
        self.table = np.full((max_reqs, width), null, dtype=np.int32)
        self.committed = self.table.copy()  # what the device reads
        self.row_of: dict[int, int] = {}
        self.num_rows = 0  # rows in use, holes included
        self.seen: set[int] = set()  # requests `update` has scheduled before (the others are new)

    def remove(self, rid: int) -> None:
        """`InputBatch.remove_request`: the row becomes a hole (cleared when the rule says so)."""
        row = self.row_of.pop(rid, None)
        if row is not None and self.rules.clear_finished_row:
            self.table[row] = self.null

    def _fit(self, width: int) -> None:
        """Widen the table (and its device copy) to `width` columns of the null block."""
        extra = width - self.table.shape[1]
        if extra > 0:
            pad = np.full((len(self.table), extra), self.null, dtype=np.int32)
            self.table = np.concatenate((self.table, pad), 1)
            self.committed = np.concatenate((self.committed, pad), 1)

    def add(self, rid: int, blocks) -> None:
        """`InputBatch.add_request`: the lowest hole, else a new row at the end (`BlockTable.add_row`)."""
        used = set(self.row_of.values())
        row = next((r for r in range(self.num_rows) if r not in used), self.num_rows)
        if row >= len(self.table):
            raise ValueError(f"no free row: {len(self.table)} rows are in use")
        self._fit(len(blocks))
        self.table[row, :len(blocks)] = blocks
        self.row_of[rid] = row
        self.num_rows = max(self.num_rows, row + 1)

    def condense(self) -> None:
        """`InputBatch.condense`: the largest live row into the smallest hole, until none is below it."""
        live = sorted(self.row_of.values())
        holes = [r for r in range(self.num_rows) if r not in set(live)]
        rid_at = {r: rid for rid, r in self.row_of.items()}
        for hole in holes:
            if not live or hole >= live[-1]:
                break
            last = live.pop()
            self.table[hole] = self.table[last]
            if self.rules.move_row_zeroes_source:
                self.table[last] = self.null
            self.row_of[rid_at[last]] = hole
            live.insert(0, hole)
            live.sort()
        self.num_rows = len(self.row_of)

    def update(self, scheduled, grown: bool = False, finished=()) -> None:
        """One step's `_update_states` (`scheduled`: (rid, blocks) of the step's requests), in its
        order: every request not scheduled in this step leaves the batch (finished, preempted or
        waiting: vLLM removes unscheduled requests and adds them back when they are scheduled
        again), and so does one whose blocks changed (resumed after preemption: vLLM counts the
        resumed ones among the unscheduled); then the requests new to the runner take rows, in the
        step's order, then the others not in the batch (resumed: `reqs_to_add` holds
        `scheduled_new_reqs` first); then `condense`. `grown` (a block size): a request's row grows as
        it runs, so one that stays has its row rewritten in place, and only one in `finished`
        (preempted since) is added anew."""
        now = dict(scheduled)
        for rid in [r for r in self.row_of if r not in now]:
            self.remove(rid)
        for rid, blocks in scheduled:
            row = self.row_of.get(rid)
            if row is not None and grown:
                if rid in finished:
                    self.remove(rid)
                else:
                    self._fit(len(blocks))
                    self.table[row, :len(blocks)] = blocks
            elif row is not None and list(self.table[row, :len(blocks)]) != list(blocks):
                self.remove(rid)
        absent = [(rid, blocks) for rid, blocks in scheduled if rid not in self.row_of]
        for rid, blocks in [x for x in absent if x[0] not in self.seen] + [x for x in absent if x[0] in self.seen]:
            self.add(rid, blocks)
        self.seen.update(now)
        self.condense()

    def commit(self, n: int) -> None:
        """`BlockTable.commit_block_table(n)`: the first n rows reach the device copy."""
        self.committed[:n] = self.table[:n]

    def rows(self, rids) -> np.ndarray:
        """The committed block-table rows of these requests, in this order."""
        return self.committed[[self.row_of[r] for r in rids]] if rids else self.committed[:0]
