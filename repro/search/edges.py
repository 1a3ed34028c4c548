"""Which edges of the control rules a run of steps reaches, counted step by step.

A search can only find a bug whose trigger its sequences reach. `Edges` watches the steps a search
feeds the runner and counts, per step, the edges the control path's rules have (module names in
brackets):
- `accept:all`, `accept:some`, `accept:none`: a spec decode following one that kept all 1+K
  tokens, some, or only the bonus token (its drafts rolled back) [builder: `num_accepted_tokens`];
- `prompt:1+K`: a prompt of exactly 1+K tokens scheduled whole, and `uniform-shape-prefill`: a step
  whose every query is 1+K tokens with a request still in its prompt (vLLM #53051's trigger)
  [dispatch: `uniform_decode`];
- `first-chunk:1`: a one-token first chunk (vLLM #51565) [builder: `split_non_spec`];
- `chunk:later`: a later chunk of a prompt split across steps (it starts from state);
- `dummy`, `dummy-after-decode`, `dummy-after-finish`: an idle rank's dummy step, and one after a
  uniform decode staged the builder or after a request finished (vLLM #49757, #37728), as
  `repro.job.triggers` judges those hazards' triggers;
- `condense:moved`: a finish that made `InputBatch.condense` move a live row [input_batch];
- `block:reused`: a request given a state block a finished request held;
- `dispatch:FULL`, `dispatch:PIECEWISE`, `dispatch:NONE`: how the runner runs the step [dispatch];
- with a block size (prefix caching): `prefix:hit`, a request whose first chunk starts past
  computed tokens (from a cached block); `block:copy`, a running column that moved, so the state is
  copied forward before the step (`preprocess_mamba`); `chunk:floored`, a prompt chunk that ends
  on a block boundary before the prompt's end (the scheduler's block-aligned split); with drafts
  too, `block:boundary-save`, a step that first saves the block-boundary state the last step's
  kept tokens reached (`postprocess_mamba_align_gpu`).
"""
from __future__ import annotations

from collections import Counter

from ..control.dispatch import DEFAULT_SIZES, Dispatcher, prefilling, uniform_decode
from ..control.input_batch import InputBatch
from ..knobs.modes import parse_mode
from ..knobs.options import ControlRules, UniformDecode

FIXED = ControlRules()  # the rules' fixed forms: what the runner under test does at baseline
PREFIX = ("prefix:hit", "block:copy", "chunk:floored")
# The edges every search with drafts (K >= 2) and dummy steps must reach; without drafts the
# acceptance and 1+K edges are those of K = 0 (a one-token prompt is a decode's shape).
ALL = ("accept:all", "accept:some", "accept:none", "prompt:1+K", "uniform-shape-prefill", "first-chunk:1",
       "chunk:later", "dummy", "dummy-after-decode", "dummy-after-finish", "condense:moved", "block:reused",
       "dispatch:FULL", "dispatch:PIECEWISE", "dispatch:NONE")


class Edges:
    """Counts the edges of each step given to `see` (module docstring), for a runner in `mode` with
    K = `spec_tokens` and `max_num_seqs` request rows; `counts` holds them."""

    def __init__(self, mode: str, spec_tokens: int, max_num_seqs: int, sizes=DEFAULT_SIZES):
        self.k, self.max_num_seqs, self.counts = spec_tokens, max_num_seqs, Counter()
        self.dispatcher = Dispatcher(parse_mode(mode), sizes, spec_tokens, max_num_seqs)
        self.reset()

    def reset(self) -> None:
        """A fresh runner (a new example): no rows, no blocks held, no previous step; counts stay."""
        self.rows = InputBatch(self.max_num_seqs, 1 + self.k, 0, FIXED)
        self.held: dict[int, int] = {}  # state block -> the request that last held it
        self.started: set[int] = set()  # requests seen in a step
        self.staged = False  # a step so far was a uniform decode (the builder staged its buffers)
        self.finished = False  # a request finished or was preempted so far

    def see(self, b) -> None:
        c, q = self.counts, 1 + self.k
        self.finished |= bool(b.finished)
        c["block:boundary-save"] += bool(b.post_copies)
        if b.dummy:  # as `repro.job.triggers` judges the two dummy triggers
            c["dummy"] += 1
            c["dummy-after-decode"] += self.staged
            c["dummy-after-finish"] += self.finished
            return
        pre, comp, prompts = b.is_prefilling(), b.computed(), b.prompts()
        if b.block_size:
            self._prefix(b, pre, comp, prompts)
        for i, (ql, p) in enumerate(zip(b.query_lens, pre)):
            if p and comp[i] == 0 and ql == q and prompts[i] == q:
                c["prompt:1+K"] += 1
            if p and comp[i] == 0 and ql == 1:
                c["first-chunk:1"] += 1
            if p and comp[i] > 0:
                c["chunk:later"] += 1
            if self.k and b.drafts()[i] == self.k:
                a = b.accepted()[i]
                c["accept:all" if a == q else "accept:none" if a == 1 else "accept:some"] += 1
        shape = uniform_decode(UniformDecode.SHAPE, b.query_lens, pre, self.k)
        if shape and any(pre):
            c["uniform-shape-prefill"] += 1
        uniform = uniform_decode(FIXED.uniform_decode, b.query_lens, prefilling(FIXED.uniform_decode, b), self.k)
        self.staged |= uniform
        c[f"dispatch:{self.dispatcher.dispatch(b.num_tokens, uniform)[0].name}"] += 1
        before = dict(self.rows.row_of)
        self.rows.update(list(zip(b.request_ids, b.block_rows())))
        if any(self.rows.row_of.get(r) not in (None, row) for r, row in before.items()):
            c["condense:moved"] += 1
        for rid, blocks in zip(b.request_ids, b.block_rows()):
            for blk in blocks:
                if self.held.get(blk, rid) != rid:
                    c["block:reused"] += 1
                self.held[blk] = rid

    def _prefix(self, b, pre, comp, prompts) -> None:
        c, bs = self.counts, b.block_size
        for i, rid in enumerate(b.request_ids):
            if rid not in self.started and comp[i] > 0 and pre[i]:
                c["prefix:hit"] += 1
            self.started.add(rid)
            if b.prev_cols and b.prev_cols[i] not in (-1, b.state_cols[i]):
                c["block:copy"] += 1
            end = comp[i] + b.query_lens[i]
            if pre[i] and end < prompts[i] and end % bs == 0:
                c["chunk:floored"] += 1

    def missing(self, wanted=ALL) -> list[str]:
        return [e for e in wanted if not self.counts[e]]
