"""A spec decode's kept count, settled when the next step is scheduled: the scheduler hands out a
decode's 1+K tokens (the bonus token and K drafts) and learns how many were kept (`accepted`) only
from the step after it, as vLLM's scheduler learns it from the model's output
(`vllm/v1/core/sched/scheduler.py: Scheduler.update_from_output`)."""
from __future__ import annotations

from typing import Mapping

from ..errors import BadInput
from ..control.shape import decode_len
from .request import Req as _Req


class KeptCounts:
    """The `Scheduler`'s settling of its decodes' kept counts (a part of it: `scheduler.Scheduler`
    holds the state): each count checked, given by the caller or drawn from the request's `accept`
    list, and kept: num_computed advanced, the count reported by the request's next step."""

    def _check_kept(self, rid: int, a) -> None:
        if not isinstance(a, int) or isinstance(a, bool) or not 1 <= a <= decode_len(self.spec_tokens):
            raise BadInput(f"request {rid}: a kept count of {a!r}; a spec decode keeps 1..{decode_len(self.spec_tokens)}")

    def _settle(self, accepted: Mapping[int, int] | None) -> None:
        """The previous step's decodes keep `a` of their 1+K tokens (the bonus token and a-1
        drafts): num_computed advances by `a`, the rejected drafts roll back
        (`Scheduler.update_from_output`: num_computed_tokens -= num_rejected), and `a` is what the
        request's next step reports as num_accepted (`vllm/v1/worker/gpu_model_runner.py:
        GPUModelRunner._update_states_after_model_execute`); with a block size, the boundary state
        the kept tokens reached is saved and the columns behind them let go (`AlignedBlocks`)."""
        accepted = dict(accepted or {})
        for r in self._running + self._waiting:
            if not r.pending:
                continue
            a = accepted.pop(r.rid) if r.rid in accepted else self._next_kept(r)
            self._check_kept(r.rid, a)
            self._keep(r, a)
        if accepted:
            raise BadInput(f"request {next(iter(accepted))} had no decode in the previous step to keep tokens of")

    def _next_kept(self, r: _Req) -> int:
        """Its `accept` list's next value, or all 1+K; 1 for a decode the budget left no drafts (not
        a spec decode: it takes no value of the list)."""
        if not r.drafts:
            return 1
        if not r.accept:
            return decode_len(self.spec_tokens)
        r.taken += 1
        return r.accept[(r.taken - 1) % len(r.accept)]

    def _keep(self, r: _Req, a: int) -> None:
        a = min(a, 1 + r.drafts)  # a decode whose drafts the budget cut keeps at most those
        c = r.num_computed
        r.drafted.update(range(c + 1, c + a))
        r.num_computed, r.num_accepted, r.pending = c + a, a, False
        if self.block_size and r.cols:  # running (a preempted request holds no blocks)
            self._cache_kept(r, c + a)  # `Scheduler.update_from_output` caches what spec decodes kept
            self._settle_aligned(r, c, a)
