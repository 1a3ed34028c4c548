"""A scheduled step handed to the runner and the requests advanced by it: the step's rows in the
runner's order with their tokens, state blocks and the settings' fields (what vLLM's
`SchedulerOutput` tells the runner, built at the end of `vllm/v1/core/sched/scheduler.py:
Scheduler.schedule`), then each row's request moved on as the step leaves it (a chunk computed, as
`Scheduler._update_after_schedule` advances num_computed_tokens; a decode pending its kept count,
which `kept.KeptCounts` settles when the next step is scheduled)."""
from __future__ import annotations

from ..control.batch import StepBatch
from .request import Req as _Req
from .tokens import draft as _draft
from .tokens import token as _token


class StepEmission:
    """The `Scheduler`'s emission of a scheduled step (a part of it: `scheduler.Scheduler` holds the
    state and schedules the rows): the step built from its rows, the requests advanced after it,
    and the token a request holds at a position."""

    def _emit(self, rows, t: int, running: int) -> StepBatch:
        """The step of `rows` ((request, query length, is a decode, drafts) in the order scheduled,
        the running requests' first `running`), its rows in the runner's order (`order.RowOrder`)."""
        bs = self.block_size
        post = self._take_post()  # the last step's; this step's own (a released decode's) go with the next
        new = rows[running:]
        resumed = {r.rid for r, *_ in new if r.preempted}
        received = [x for x in new if x[0].rid not in resumed] + rows[:running] + [x for x in new if x[0].rid in resumed]
        order = self.order.step([(r.rid, q, r.num_computed, r.prompt_len) for r, q, *_ in received], self._finished,
                                resumed)
        rows = sorted(rows, key=lambda x: order.index(x[0].rid))
        for r, *_ in rows:
            if r.last_call != self.calls - 1:  # it left the runner's batch: `InputBatch.add_request` counts 1
                r.num_accepted = 1
            r.last_call = self.calls
        ids, slots, qlens, init, toks = [], [], [], [], []
        computed, prompts, drafts, accepted, blocks = [], [], [], [], []
        aligned = dict(block_size=bs, state_cols=[x[0].col for x in rows], prev_cols=[x[0].prev for x in rows]) if bs else {}
        for r, q, decode, d in rows:
            c = r.num_computed
            ids.append(r.rid)
            slots.append(r.blocks[r.col])
            qlens.append(q)
            init.append(c > 0)
            computed.append(c)
            prompts.append(r.prompt_len)
            drafts.append(d)
            accepted.append(r.num_accepted)
            blocks.append(list(r.blocks))
            if decode:
                toks.append(self._tok(r, c))
                toks.extend(_draft(self.seed, r.rid, c + j, self.vocab) for j in range(1, d + 1))
            else:  # a padded first chunk's placeholder drafts: the runner clamps their -1 to 0 (`_preprocess`)
                toks.extend([self._tok(r, p) for p in range(c, c + q - d)] + [0] * d)
        finished, self._finished = self._finished, []
        lag = self.config.async_scheduling  # the scheduler learns of a stop one step late (`config.py`)
        lagged = [r.rid for r, *_ in rows if r.stopped]
        placeholders = [r.out[1] if r.out[0] == self.emitted - 1 else 0 for r, *_ in rows] if lag else None
        self._advance(rows, t, lag)
        b = StepBatch(ids, slots, qlens, init, toks, step=self.emitted, live_slots=self.owned(),
                      num_computed=computed, prompt_lens=prompts, draft_lens=drafts, num_accepted=accepted,
                      blocks=blocks, finished=finished, post_copies=post, **aligned,
                      num_output_placeholders=placeholders, lagged=lagged,
                      prefill_lens=None if (pre := [x[0].target for x in rows]) == prompts else pre)  # resumed
        self.emitted += 1
        return b

    def _advance(self, rows, t: int, lag: bool) -> None:
        """After the step is emitted: each decode pending its kept count and released where it stops
        (or is preempted), each chunk computed; with a block size, the columns behind each let go."""
        for r, q, decode, d in rows:
            if decode:
                r.pending, r.drafts, r.out = True, d, (self.emitted, 1 + d)
                r.decodes += 1
                if r.stopped or (r.decode_steps is not None and r.decodes >= r.decode_steps and not lag):
                    self._release(r, False, t + 1)
                elif r.decode_steps is not None and r.decodes >= r.decode_steps:
                    r.stopped = True
                elif r.preempt_after is not None and r.decodes == r.preempt_after and not r.preempted:
                    self._release(r, True, t + 1 + lag)  # async: its in-flight output drains first
            else:  # a placeholder draft is never kept: the padded chunk computes its one token
                r.num_computed += q - d
                r.num_accepted = 1
                if r.num_computed >= r.target:
                    r.out = (self.emitted, 1)  # the prompt's last chunk samples a token
                    if r.decode_steps == 0:
                        r.stopped = lag
                        if not lag:
                            self._release(r, False, t + 1)
        for r, _, decode, _ in rows if self.block_size else ():
            if r in self._running:
                self._retire(r, r.num_computed + decode)  # a decode has kept one token at least

    def _tok(self, r: _Req, pos: int) -> int:
        if pos in r.drafted:
            return _draft(self.seed, r.rid, pos, self.vocab)
        rid = r.rid
        while rid in self._prefix and pos < self._prefix[rid][1]:  # a shared prefix: the other request's token
            rid = self._prefix[rid][0]
        return _token(self.seed, rid, pos, self.vocab)
