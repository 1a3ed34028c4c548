"""vLLM's V1 scheduler driven by a suite `Sequence`: the `StepBatch`es that vLLM's own `Scheduler`
(`vllm/v1/core/sched/scheduler.py`) and the V1 runner's bookkeeping (`rows.Rows`) make of its
requests, the same type the mirror's scheduler yields (`repro.scheduler.steps.schedule`).

A tick at a time, as `EngineCore.step` (`vllm/v1/engine/core.py`) runs it:

- a request is added (`Scheduler.add_request`) at its arrival tick, in (arrival, id) order, with
  its prompt's token ids (shared prefixes included), greedy sampling and a stop token;
- `schedule()`; the runner's side of the output (`Rows`: row order, accepted counts, state columns);
- `update_from_output` with a `ModelRunnerOutput` that keeps the sequence's counts: a request whose
  step reaches the end of its known tokens samples the accepted drafts and a bonus token (a spec
  decode keeps its `accept` list's next count, clamped to the drafts it was scheduled; every other
  sampling step keeps 1), a non-final prefill chunk samples nothing; the step that ends a request
  (its `decode_steps`-th decode since it was admitted, or its prompt's last chunk when that is 0)
  samples the stop token last, so vLLM finishes it itself (`_update_request_with_output`);
- `update_draft_token_ids` with K drafts each (unless the output says `skip_drafts`): the suite's
  draft tokens (`repro.scheduler.tokens.draft`) at the positions after the last sampled token;
- a preemption the sequence asks for (`preempt_after` decodes, once): vLLM's own two steps for it,
  the request taken off `Scheduler.running` and `Scheduler._preempt_request` (what `schedule()`
  does to the request it evicts when the KV blocks run out, and `reset_prefix_cache(
  reset_running_requests=True)` to each running request), and, as `reset_prefix_cache` does, the
  request dropped from `prev_step_scheduled_req_ids` so a resume in the next step hands the runner
  its tokens. The resume (when, in what chunks) is then vLLM's. With `num_blocks` small enough,
  `schedule()` preempts by itself.

A tick that schedules nothing emits no step (its finished requests ride the next step); on a
data-parallel rank an idle tick runs a dummy step (the engine schedules first if finished requests
are pending: `EngineCore.step` then `DPEngineCoreProc.run_busy_loop`'s `execute_dummy_batch`).
Token ids (`repro.scheduler.tokens`) are passed in: the scheduler sits above this seam.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ..control.batch import StepBatch
from ..errors import BadInput
from .case import Case
from .config import scheduler, vllm_config
from .rows import GDN_GROUP, Rows, cdiv
from ..control.shape import decode_len

TICK_LIMIT = 10_000  # ticks past the last arrival (the mirror's limit)


@dataclass
class _Track:
    """What the driver keeps of a request beside vLLM's `Request`."""
    req: object  # the sequence's request
    decodes: int = 0  # decode steps since its last admission
    taken: int = 0  # accept-list values used
    preempted: bool = False  # the sequence's preemption happened
    prefill_end: int = 0  # its tokens when last admitted (the V2 runner's prefill_len)


def ample_blocks(seq, cfg) -> int:
    """KV blocks enough that every request of `seq` could run at once twice over (the prompt and
    every decode's 1+K tokens, a resume's recompute too): vLLM then preempts only when asked."""
    k = seq.spec_tokens
    most = max((r.prompt_len + (2 * r.decode_steps + 3) * decode_len(k) for r in seq.requests), default=1)
    state = cdiv(most, seq.block_size) + decode_len(k) if seq.block_size else decode_len(k)
    return 2 * seq.num_slots * (cdiv(most, cfg.cache_config.block_size) + state) + 2


class VllmScheduler:
    """vLLM's V1 scheduler over a `Sequence` (module docstring). `token(seed, rid, pos, vocab)` and
    `draft(...)` are the suite's token ids (`repro.scheduler.tokens`)."""

    def __init__(self, up, seq, token, draft, num_blocks: int | None = None, mode: str = "full_and_piecewise",
                 cache=None):
        self.up, self.seq, self.token, self.draft = up, seq, token, draft
        self.k = seq.spec_tokens
        if seq.async_scheduling:
            raise BadInput("async scheduling: vLLM's AsyncScheduler (its one-step lag) is not driven here; its "
                           "streams run on the mirror's scheduler only")
        self.case = Case(mode=mode, spec_tokens=self.k, max_num_seqs=seq.num_slots,
                         max_num_batched_tokens=seq.max_tokens, block_size=seq.block_size, cache=cache,
                         max_num_scheduled_tokens=seq.max_num_scheduled_tokens,
                         long_prefill_token_threshold=seq.long_prefill_token_threshold)
        self.cfg = vllm_config(up, self.case)
        self.num_blocks = num_blocks or ample_blocks(seq, self.cfg)
        self.sched, self.hasher = scheduler(up, self.cfg, self.num_blocks)
        self.rows = Rows(up, self.cfg)
        self.stop = seq.vocab  # no token of the sequence: it ends a request when sampled
        self.prefix = {r.rid: (r.prefix_of, r.prefix_len) for r in seq.requests if r.prefix_of is not None and r.prefix_len}
        self.tracks: dict[str, _Track] = {}
        self.tick = 0
        self.emitted = 0
        self.finished: set[str] = set()  # finished or preempted since the last emitted step
        self.post: list[list[int]] = []  # the last step's boundary copies

    # -- tokens ---------------------------------------------------------------------------------
    def token_at(self, rid: int, pos: int) -> int:
        """The sequence's token at `pos` of request `rid` (a shared prefix: the other request's)."""
        seen = {rid}
        while rid in self.prefix and pos < self.prefix[rid][1]:
            rid = self.prefix[rid][0]
            if rid in seen:
                raise BadInput(f"request {rid}: its prefix_of chain leads back to itself")
            seen.add(rid)
        return self.token(self.seq.seed, rid, pos, self.seq.vocab)

    def _add(self, r) -> None:
        up = self.up
        sp = up.sampling_params.SamplingParams(max_tokens=self.cfg.model_config.max_model_len, temperature=0.0,
                                               stop_token_ids=[self.stop], ignore_eos=True)
        self.tracks[str(r.rid)] = _Track(r)
        self.sched.add_request(up.request.Request(
            request_id=str(r.rid), prompt_token_ids=[self.token_at(r.rid, p) for p in range(r.prompt_len)],
            sampling_params=sp, pooling_params=None, block_hasher=self.hasher))

    # -- the run --------------------------------------------------------------------------------
    def batches(self) -> list[StepBatch]:
        """Every step of the sequence (module docstring), dummy steps included."""
        seq = self.seq
        if seq.tail_dummies and not seq.data_parallel:
            raise BadInput(f"tail_dummies {seq.tail_dummies} needs data_parallel (only an idle data-parallel rank runs one)")
        waiting = sorted(seq.requests, key=lambda r: (r.arrive, r.rid))
        limit = TICK_LIMIT + max((r.arrive for r in seq.requests), default=0)
        out: list[StepBatch] = []
        while waiting or self.sched.has_unfinished_requests():
            while waiting and waiting[0].arrive <= self.tick:
                self._add(waiting.pop(0))
            if seq.data_parallel and not self.sched.has_unfinished_requests():
                out.append(self.dummy())
            else:
                b = self.step()
                if b is not None:
                    out.append(b)
            self.tick += 1
            if self.tick > limit:
                raise BadInput("the sequence does not finish under vLLM's scheduler (a request is never scheduled)")
        out.extend(self.dummy() for _ in range(seq.tail_dummies))
        return out[: seq.max_steps]

    def dummy(self) -> StepBatch:
        """An idle data-parallel rank's tick: the pending finished requests leave the runner's batch
        in an empty step (as `EngineCore.step` schedules while any are pending), then the dummy run."""
        if self.sched.has_finished_requests():
            self.step()
        b = StepBatch([], [], [], [], [], step=self.emitted, live_slots=self.live(), num_computed=[], prompt_lens=[],
                      draft_lens=[], num_accepted=[], blocks=[], finished=self._take_finished(), dummy=True,
                      post_copies=self.post)
        self.post = []
        self.emitted += 1
        return b

    def _take_finished(self) -> list[int]:
        done, self.finished = sorted(int(r) for r in self.finished), set()
        return done

    def live(self) -> list[int]:
        """The state blocks running requests hold (the scheduler's view: null entries left out)."""
        mgr = self.sched.kv_cache_manager
        return sorted(b for req in self.sched.running for b in mgr.get_block_ids(req.request_id)[GDN_GROUP] if b)

    def step(self) -> StepBatch | None:
        """One `schedule()` and its output (module docstring); None when it scheduled nothing."""
        out = self.sched.schedule()
        self.finished |= set(out.finished_req_ids) | set(out.preempted_req_ids or ())
        self.rows.update(out)
        if not out.total_num_scheduled_tokens:
            self.sched.update_from_output(out, self.up.outputs.EMPTY_MODEL_RUNNER_OUTPUT)
            return None
        for new in out.scheduled_new_reqs:
            self.tracks[new.req_id].decodes = 0
            self.tracks[new.req_id].prefill_end = self.sched.requests[new.req_id].num_tokens
        for rid in out.scheduled_cached_reqs.resumed_req_ids:
            self.tracks[rid].decodes = 0
            self.tracks[rid].prefill_end = self.sched.requests[rid].num_tokens
        order = self.rows.order()
        cols = self.rows.columns(out) if self.rows.block_size else {}
        b = self._batch(out, order, cols)
        kept, sampled, decoded = self._sample(out, order)
        self.sched.update_from_output(out, self.up.outputs.ModelRunnerOutput(
            req_ids=order, req_id_to_index={r: i for i, r in enumerate(order)}, sampled_token_ids=sampled))
        self._propose(order, out)
        for rid in decoded:
            t = self.tracks[rid]
            t.decodes += 1
            req = self.sched.requests.get(rid)
            if (t.req.preempt_after is not None and t.decodes == t.req.preempt_after and not t.preempted
                    and req is not None and req in self.sched.running):
                t.preempted = True
                self.preempt(rid)
        self.post = self.rows.after(out, kept)
        b.live_slots = self.live()
        return b

    def preempt(self, rid: str) -> None:
        """vLLM's preemption of one running request, between steps (module docstring)."""
        req = self.sched.requests[rid]
        self.sched.running.remove(req)
        self.sched._preempt_request(req, time.monotonic())
        self.sched.prev_step_scheduled_req_ids.discard(rid)

    def _batch(self, out, order, cols) -> StepBatch:
        """The step's `StepBatch`, rows in the runner's order, before the step's output."""
        ids, slots, qlens, init, toks = [], [], [], [], []
        computed, prompts, prefills, drafts, accepted, blocks = [], [], [], [], [], []
        for rid in order:
            req = self.sched.requests[rid]
            c, q = self.rows.num_computed(rid), out.num_scheduled_tokens[rid]
            spec = out.scheduled_spec_decode_tokens.get(rid, [])
            row = self.rows.blocks(rid)
            ids.append(int(rid))
            slots.append(row[cols[rid][1]] if cols else row[0])
            qlens.append(q)
            init.append(c > 0)
            # `GPUModelRunner._preprocess` clamps the scheduler's placeholder drafts (-1) to 0
            toks.extend(list(req.all_token_ids[c:c + q - len(spec)]) + [max(int(t), 0) for t in spec])
            computed.append(c)
            prompts.append(req.num_prompt_tokens)
            prefills.append(self.tracks[rid].prefill_end)
            drafts.append(len(spec))
            accepted.append(self.rows.accepted(rid))
            blocks.append(row)
        aligned = {}
        if cols:
            aligned = dict(block_size=self.rows.block_size, state_cols=[cols[r][1] for r in order],
                           prev_cols=[cols[r][0] for r in order])
        b = StepBatch(ids, slots, qlens, init, toks, step=self.emitted, num_computed=computed, prompt_lens=prompts,
                      prefill_lens=None if prefills == prompts else prefills, draft_lens=drafts, num_accepted=accepted,
                      blocks=blocks, finished=self._take_finished(), post_copies=self.post, **aligned)
        self.emitted += 1
        return b

    def _sample(self, out, order):
        """What the step samples (module docstring): (kept count by request, sampled ids in row
        order, the requests whose step was a decode)."""
        kept, sampled, decoded = {}, [], []
        for rid in order:
            t, req = self.tracks[rid], self.sched.requests[rid]
            spec = out.scheduled_spec_decode_tokens.get(rid, [])
            c_before = req.num_computed_tokens - out.num_scheduled_tokens[rid]
            known = req.num_tokens  # `_update_after_schedule` advanced num_computed_tokens only
            decode = c_before >= t.prefill_end
            a = 1
            if decode:
                decoded.append(rid)
                if self.k and any(s >= 0 for s in spec):
                    acc = t.req.accept
                    a = min(acc[t.taken % len(acc)] if acc else decode_len(self.k), 1 + len(spec))
                    t.taken += 1
            kept[rid] = a
            if c_before + out.num_scheduled_tokens[rid] - len(spec) < known:
                sampled.append([])  # a prefill chunk before the last: the runner discards its token
                continue
            ids = list(spec[:a - 1]) + [self.token_at(int(rid), known + a - 1)]
            ends = t.req.decode_steps is not None and (t.decodes + 1 >= t.req.decode_steps if decode
                                                       else t.req.decode_steps == 0)
            if ends:
                ids[-1] = self.stop
            sampled.append(ids)
        return kept, sampled, decoded

    def _propose(self, order, out) -> None:
        """The drafter's K tokens for each request the step sampled for (`update_draft_token_ids`
        drops them for a prefill chunk)."""
        if not self.k or self.up.skips_drafts(out):
            return
        live = [r for r in order if r in self.sched.requests and not self.sched.requests[r].is_finished()]
        props = [[self.draft(self.seq.seed, int(r), self.sched.requests[r].num_tokens + j, self.seq.vocab)
                  for j in range(self.k)] for r in live]
        self.sched.update_draft_token_ids(self.up.outputs.DraftTokenIds(live, props))


def schedule(up, seq, token, draft, **kwargs) -> list[StepBatch]:
    """The steps vLLM's V1 scheduler makes of `seq` (`VllmScheduler.batches`)."""
    return VllmScheduler(up, seq, token, draft, **kwargs).batches()
