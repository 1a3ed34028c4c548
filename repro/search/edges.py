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

The scheduler's rarer states (`RARE`; `repro/scheduler/config.py` cites what each mirrors), counted
for the sequences `watch` is given:
- `full-pad:parked`: a FULL step padded to its capture size while a running request is left out
  of it (parked: a scheduled budget below the capture size);
- `long-prefill:cut`: a prompt chunk cut to `long_prefill_token_threshold`;
- `recompute:last-1`, `recompute:last-1+K`: with K > 0, a resumed request's recompute after a
  preemption whose last chunk is 1 token (a spec row of no drafts to the V1 runner) or 1+K tokens
  (a decode's shape);
- `async:placeholders`: a decode scheduled while its last step's output was still in flight
  (`AsyncScheduler`), and `async:lagged`: a request scheduled once more after it stopped;
- `dp:padded-smaller`, `dp:padded-idle`: a step, or an idle rank's dummy step, padded past its
  own size to the other data-parallel rank's (`coordinate_batch_across_dp`).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

from ..control.dispatch import DEFAULT_SIZES, Dispatcher, default_capture_sizes, dispatch_step, prefilling, uniform_decode
from ..control.input_batch import InputBatch
from ..knobs.modes import Runtime, parse_mode
from ..knobs.options import ControlRules, UniformDecode
from ..control.shape import StepShape, decode_len

FIXED = ControlRules()  # the rules' fixed forms: what the runner under test does at baseline
PREFIX = ("prefix:hit", "block:copy", "chunk:floored")
# The edges every search with drafts (K >= 2) and dummy steps must reach; without drafts the
# acceptance and 1+K edges are those of K = 0 (a one-token prompt is a decode's shape).
ALL = ("accept:all", "accept:some", "accept:none", "prompt:1+K", "uniform-shape-prefill", "first-chunk:1",
       "chunk:later", "dummy", "dummy-after-decode", "dummy-after-finish", "condense:moved", "block:reused",
       "dispatch:FULL", "dispatch:PIECEWISE", "dispatch:NONE")
# The scheduler's rarer states (module docstring): a search with K > 0 on a data-parallel rank reaches each.
RARE = ("full-pad:parked", "long-prefill:cut", "recompute:last-1", "recompute:last-1+K", "async:placeholders",
        "async:lagged", "dp:padded-smaller", "dp:padded-idle")


class Edges:
    """Counts the edges of each step given to `see` (module docstring), for a runner in `mode` with
    K = `spec_tokens` and `max_num_seqs` request rows; `counts` holds them."""

    def __init__(self, mode: str, spec_tokens: int, max_num_seqs: int, sizes=DEFAULT_SIZES):
        self.mode, self.k, self.max_num_seqs, self.counts = mode, spec_tokens, max_num_seqs, Counter()
        self.dispatcher = Dispatcher(parse_mode(mode), sizes, StepShape(spec_tokens, max_num_seqs))
        self.threshold = 0  # the long prefill threshold of the sequence watched (`watch`)
        self.reset()

    def watch(self, seq, mode: str | None = None) -> None:
        """Count every step of `seq` (a `Sequence`) as a fresh runner in `mode` (default: this
        counter's) runs it: its K, request rows, capture sizes and scheduler settings."""
        mode = mode or self.mode
        self.k, self.max_num_seqs, self.threshold = seq.spec_tokens, seq.num_slots, seq.long_prefill_token_threshold
        self.dispatcher = Dispatcher(parse_mode(mode), default_capture_sizes(seq.num_slots, seq.max_tokens, self.k),
                                     StepShape.of(seq))
        self.reset()
        for b in seq.batches():
            self.see(b)

    def reset(self) -> None:
        """A fresh runner (a new example): no rows, no blocks held, no previous step; counts stay."""
        self.rows = InputBatch(self.max_num_seqs, decode_len(self.k), 0, FIXED)
        self.held: dict[int, int] = {}  # state block -> the request that last held it
        self.started: set[int] = set()  # requests seen in a step
        self.staged = False  # a step so far was a uniform decode (the builder staged its buffers)
        self.finished = False  # a request finished or was preempted so far

    def see(self, b) -> None:
        c, q = self.counts, decode_len(self.k)
        self.finished |= bool(b.finished)
        c["block:boundary-save"] += bool(b.post_copies)
        runtime, desc = dispatch_step(self.dispatcher, b, FIXED.uniform_decode)
        if b.dp_peer is not None and runtime.value:
            own = dispatch_step(self.dispatcher, replace(b, dp_peer=None), FIXED.uniform_decode)[1]
            c["dp:padded-idle" if b.dummy else "dp:padded-smaller"] += desc.num_tokens > own.num_tokens
        if b.dummy:  # as `repro.job.triggers` judges the two dummy triggers
            c["dummy"] += 1
            c["dummy-after-decode"] += self.staged
            c["dummy-after-finish"] += self.finished
            return
        self._rare(b, runtime, desc)
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
        c[f"dispatch:{runtime.name}"] += 1
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

    def _rare(self, b, runtime, desc) -> None:
        c, q = self.counts, decode_len(self.k)
        held = {x for row in b.block_rows() for x in row}
        if runtime is Runtime.FULL and desc.num_tokens > b.num_tokens and set(b.live_slots) - held:
            c["full-pad:parked"] += 1
        c["async:lagged"] += bool(b.lagged)
        pre, comp, prefills = b.is_prefilling(), b.computed(), b.prefills()
        for i, (ql, p) in enumerate(zip(b.query_lens, pre)):
            end = comp[i] + ql
            if self.threshold and ql == self.threshold and end < prefills[i]:
                c["long-prefill:cut"] += 1
            if self.k and prefills[i] > b.prompts()[i] and end == prefills[i] and ql in (1, q):
                c["recompute:last-1" if ql == 1 else "recompute:last-1+K"] += 1
            if b.num_output_placeholders and b.num_output_placeholders[i] and not p and comp[i] >= prefills[i]:
                c["async:placeholders"] += 1

    def missing(self, wanted=ALL) -> list[str]:
        return [e for e in wanted if not self.counts[e]]
