"""The scheduler's request queues, the book-keeping between steps (vLLM's `Scheduler.running` and
`Scheduler.waiting`): requests queued (`vllm/v1/core/sched/scheduler.py: Scheduler.add_request`),
admitted with their blocks, ended or preempted by the caller (`Scheduler.finish_requests`,
`Scheduler._preempt_request`), and the views the caller reads of them."""
from __future__ import annotations

from ..errors import BadInput
from ..control.shape import decode_len
from .request import Req as _Req


class RequestQueues:
    """The `Scheduler`'s queues (a part of it: `scheduler.Scheduler` holds the state): the running
    requests, holding blocks in admission order, and the waiting ones, FCFS with a preempted
    request at the front; what the caller asks of them and does to them between steps."""

    # -- what the caller asks -------------------------------------------------------------------

    def running(self) -> list[int]:
        """Requests holding state blocks (decoding, part way through their prompt, or waiting for
        budget), in admission order."""
        return [r.rid for r in self._running]

    def waiting(self) -> list[int]:
        return [r.rid for r in self._waiting]

    def awaiting(self) -> list[int]:
        """Requests whose last step was a decode whose kept count is still open: those the next
        `step`'s `accepted` may name (with K = 0 the count can only be 1)."""
        return [r.rid for r in self._running + self._waiting if r.pending]

    def done(self) -> bool:
        return not self._running and not self._waiting

    def idle(self) -> bool:
        """Nothing this rank could run now: no request holds blocks, none has arrived."""
        return not self._running and not any(r.arrive <= self.tick for r in self._waiting)

    def owned(self) -> list[int]:
        if self.block_size:
            return sorted(b for r in self._running for b in r.cols.values())
        return sorted(b for r in self._running for b in r.blocks)

    @property
    def prefix_hits(self) -> int:
        """Requests started from a cached block so far (0 without a block size)."""
        return self.pool.hits if self.pool is not None else 0

    # -- what the caller does -------------------------------------------------------------------

    def add(self, rid: int, prompt_len: int, decode_steps: int | None = None, arrive: int | None = None,
            preempt_after: int | None = None, accept: list[int] | None = None, prefix_of: int | None = None,
            prefix_len: int = 0) -> None:
        """Queue a request: schedulable from tick `arrive` (default: now), finished after
        `decode_steps` decode steps (None: when `finish` says), preempted once after
        `preempt_after` of them; `accept`: the kept counts of its spec decodes, in order, cycled;
        its first `prefix_len` tokens are those of request `prefix_of` (a shared prefix)."""
        if prefix_of is not None and prefix_len:
            src = prefix_of
            while src != rid and src in self._prefix:
                src = self._prefix[src][0]
            if src == rid:
                raise BadInput(f"request {rid}: prefix_of {prefix_of} leads back to request {rid}")
            self._prefix[rid] = (prefix_of, prefix_len)
        if prompt_len < 1:
            raise BadInput(f"request {rid}: prompt_len {prompt_len} must be at least 1")
        if any(r.rid == rid for r in self._running + self._waiting):
            raise BadInput(f"request {rid} is already scheduled")
        for a in accept or ():
            self._check_kept(rid, a)
        if accept is not None and not accept:
            raise BadInput(f"request {rid}: accept is empty (leave it out to keep every draft)")
        self._waiting.append(_Req(rid, prompt_len, decode_steps, self.tick if arrive is None else arrive,
                                  preempt_after, list(accept) if accept else None))

    def finish(self, rid: int, preempt: bool = False) -> None:
        """End a running request between steps; its blocks are freed. Preempted, it waits to be
        recomputed from scratch (`vllm/v1/core/sched/scheduler.py: Scheduler._preempt_request`)."""
        r = next((r for r in self._running if r.rid == rid), None)
        if r is None:
            raise BadInput(f"request {rid} is not running")
        self._release(r, preempt, self.tick)

    def abort_waiting(self) -> list[int]:
        """End every request still waiting (none holds blocks; `Scheduler.finish_requests` on a
        waiting request removes it from the queue), so a rank whose running requests finished goes
        idle. Returns their ids."""
        gone = [r.rid for r in self._waiting]
        self._waiting = []
        return gone

    # -- inside ---------------------------------------------------------------------------------

    def _admit(self, r: _Req, need: int) -> None:  # without a block size (`_admit_aligned`: with one)
        self._waiting.remove(r)
        r.blocks, self.free = self.free[: decode_len(self.spec_tokens)], self.free[decode_len(self.spec_tokens):]
        r.target, r.num_computed, r.decodes, r.num_accepted = need, 0, 0, 1  # InputBatch.add_request: accepted 1
        self._running.append(r)

    def _release(self, r: _Req, preempt: bool, arrive: int) -> None:
        if r.pending:  # its last decode's outcome is known when the step ends, before it leaves
            self._keep(r, self._next_kept(r))
        self._running.remove(r)
        if self.block_size:
            for b in r.cols.values():
                self.pool.release(b)
            r.cols, r.run_col = {}, -1
        else:
            self.free = sorted(self.free + r.blocks)
        r.blocks = []
        self._finished.append(r.rid)
        if preempt:  # `Scheduler._preempt_request`: `waiting.prepend_request`
            r.preempted, r.arrive = True, arrive
            self._waiting.insert(0, r)
