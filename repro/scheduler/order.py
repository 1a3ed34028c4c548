"""The order of a step's requests as vLLM's V1 runner lays out their tokens: its persistent batch,
kept across steps, then reordered for the attention backends.

`GPUModelRunner._update_states` (`vllm/v1/worker/gpu_model_runner.py`) removes the finished
requests and every request not scheduled in the step (a resumed one too) from the persistent batch
(`InputBatch`, `vllm/v1/worker/gpu_input_batch.py`), adds the new requests, then the scheduled ones
not in it (running ones it dropped, resumed ones), each into the lowest row a removal left empty or
at the end (`_register_add_request`), and `condense()` moves the last rows into the lowest holes.
`_may_reorder_batch` then calls `reorder_batch_to_split_decodes_and_prefills`
(`vllm/v1/attention/backends/utils.py`) with the GDN builder's threshold, 1+K (the model's other
backend sets none): decodes (context, at most the threshold, past the prompt), then short extends
(context, at most the threshold, in the prompt), long extends (context, more), then prefills (no
context); a row already in its region stays, the others move into the misplaced rows in region
order. The swaps persist into the next step.
"""
from __future__ import annotations
from ..control.shape import decode_len


def region(computed: int, query: int, prompt: int, threshold: int) -> int:
    """0 decode, 1 short extend, 2 long extend, 3 prefill (module docstring)."""
    if computed == 0:
        return 3
    if query > threshold:
        return 2
    return 1 if computed < prompt else 0


class RowOrder:
    """The runner's rows, a request id or None (a hole) each."""

    def __init__(self, spec_tokens: int):
        self.threshold = decode_len(spec_tokens)
        self.rows: list[int | None] = []

    def step(self, scheduled, finished=(), resumed=()) -> list[int]:
        """The step's order. `scheduled`: (rid, query, computed, prompt) of each request scheduled,
        new ones in the order they were admitted, the others in the order the runner receives them
        (running ones, then resumed ones); `finished`: finished or preempted since the last step."""
        now = {rid for rid, *_ in scheduled}
        for i, rid in enumerate(self.rows):
            if rid is not None and (rid in finished or rid not in now or rid in resumed):
                self.rows[i] = None
        for rid, *_ in scheduled:
            if rid not in self.rows:
                hole = self.rows.index(None) if None in self.rows else len(self.rows)
                self.rows[hole:hole + 1] = [rid]
        self._condense()
        info = {rid: region(c, q, p, self.threshold) for rid, q, c, p in scheduled}
        want = sorted(info[r] for r in self.rows)
        wrong = [i for i, r in enumerate(self.rows) if info[r] != want[i]]
        moved = sorted(wrong, key=lambda i: info[self.rows[i]])
        new = list(self.rows)
        for dst, src in zip(wrong, moved):
            new[dst] = self.rows[src]
        self.rows = new
        return list(self.rows)

    def _condense(self) -> None:
        while None in self.rows:
            while self.rows and self.rows[-1] is None:
                self.rows.pop()
            if None not in self.rows:
                break
            hole = self.rows.index(None)
            self.rows[hole] = self.rows.pop()
