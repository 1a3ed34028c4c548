"""The scheduler: requests in, steps out, one step at a time, as vLLM 0.33.0's scheduler hands them
to the model runner (`vllm/v1/core/sched/scheduler.py: Scheduler.schedule`).

Each step schedules, within a token budget, the running requests in the order they came (a decode:
the bonus token and K drafts; or a prompt's next chunk), then waiting ones (`Scheduler.step`), its
rows in the V1 runner's order (`order.RowOrder`). A request holds 1+K state blocks from its first chunk until it
finishes or is preempted (vLLM's mamba cache mode "none" with speculative decoding: the running
block, then one per draft token; `vllm/model_executor/layers/mamba/abstract.py:
MambaBase.get_kv_cache_spec`, `num_speculative_blocks`), and freed blocks are reused lowest first,
so a new request's blocks hold a finished one's state. An idle data-parallel rank runs dummy steps.

With a block size (prefix caching, vLLM's mamba cache mode "align"; `repro/scheduler/prefix.py`) a
request's blocks instead grow with its sequence, prefill chunks end on block boundaries, filled
blocks are cached, and a new request may start from the longest cached prefix of its tokens. At
most `max_seqs` requests run. Settings beyond the budget (a smaller scheduled budget, the long
prefill threshold, async scheduling) are `config.SchedulerConfig`'s. `Scheduler` is the one
implementation: `steps.schedule(seq)` drives it over a `Sequence`, and the Hypothesis state machine
(`repro/search/machine.py`) drives it rule by rule.

It is read in its phases, each a part it inherits: its queues and what the caller does to them
between steps (`queues.RequestQueues`), the last step's decodes settled with their kept counts
(`kept.KeptCounts`), the step's rows scheduled (here), the step handed out and its requests
advanced (`emit.StepEmission`), and with a block size the blocks' alignment (`prefix.AlignedBlocks`)."""
from __future__ import annotations

from typing import Mapping

from ..control.batch import StepBatch
from ..errors import BadInput
from .config import SchedulerConfig
from .emit import StepEmission
from .kept import KeptCounts
from .order import RowOrder
from .request import Req as _Req
from .prefix import ALIGN_BLOCKS, AlignedBlocks, BlockPool, aligned_chunk, check_block_size
from ..control.shape import decode_len
from .queues import RequestQueues

MAX_SPEC_TOKENS = 4


class Scheduler(RequestQueues, KeptCounts, StepEmission, AlignedBlocks):
    """One FCFS scheduler, a step at a time.

    `max_tokens` is vLLM's max_num_batched_tokens, the step's token budget unless `config` sets a
    smaller max_num_scheduled_tokens (`config.SchedulerConfig`, with the other settings); `blocks` the state
    blocks requests may hold (`block_pool`), so len(blocks) // (1+K) requests run at once (vLLM's
    max_num_seqs). The caller adds requests (`add`), runs steps (`step`, given the kept counts of
    the previous step's decodes), ends requests (`finish`) and, on an idle data-parallel rank,
    runs dummy steps (`dummy`)."""

    def __init__(self, max_tokens: int, blocks, spec_tokens: int = 0, vocab: int = 512, seed: int = 0,
                 data_parallel: bool = False, block_size: int | None = None, max_seqs: int | None = None,
                 null: int = 0, config: SchedulerConfig = SchedulerConfig()):
        if not 0 <= spec_tokens <= MAX_SPEC_TOKENS:
            raise BadInput(f"spec_tokens {spec_tokens} must be 0..{MAX_SPEC_TOKENS}")
        check_block_size(block_size, spec_tokens)
        self.block_size, self.null, self.data_parallel = block_size, null, data_parallel
        self.max_seqs = max_seqs if max_seqs is not None else len(blocks) // (ALIGN_BLOCKS + spec_tokens)
        self.pool = BlockPool(sorted(blocks)) if block_size else None
        self._prefix: dict[int, tuple[int, int]] = {}  # rid -> (rid its first tokens repeat, how many)
        if max_tokens < decode_len(spec_tokens):
            raise BadInput(f"max_tokens {max_tokens} cannot hold one decode of 1+{spec_tokens} tokens")
        self.max_tokens, self.spec_tokens, self.vocab, self.seed = max_tokens, spec_tokens, vocab, seed
        config.check(max_tokens, spec_tokens)
        self.config, self.budget = config, config.budget(max_tokens)
        self.free = sorted(blocks)
        if len(self.free) < decode_len(spec_tokens):
            raise BadInput(f"{len(self.free)} state blocks cannot hold one request's 1+{spec_tokens}")
        self.tick = 0  # the tick the next step or dummy runs at (arrivals are in ticks)
        self.emitted = 0  # steps emitted, dummies included: the next step's index
        self._running: list[_Req] = []  # holding blocks, in admission order
        self._waiting: list[_Req] = []  # FCFS; a preempted request goes back to its front
        self._finished: list[int] = []  # finished or preempted since the last emitted step
        self._post: list[list[int]] = []  # boundary-state copies for the next step (`_post_align`)
        self.order = RowOrder(spec_tokens)  # the runner's rows, for the order of a step's requests
        self.calls = 0  # steps scheduled (`step` calls), empty ones included
        self._fresh: set[int] = set()  # blocks cached by the step being scheduled (`_cache_kept`)

    # -- what the caller runs (what it asks and the rest it does: `queues.RequestQueues`) -------

    def step(self, accepted: Mapping[int, int] | None = None) -> StepBatch | None:
        """Run one tick: settle the previous step's decodes with their kept counts (`accepted`:
        rid -> 1..1+K; a request left out takes its `accept` list's next value, or keeps all 1+K),
        then schedule as vLLM's `Scheduler.schedule` does: the running requests in the order they
        were admitted, each its decode (1+K tokens, the drafts cut to the budget left) or its next
        chunk (clipped to the budget left and, with a block size, to block boundaries: one clipped to
        nothing is skipped), then the waiting ones in order, each chunked to the budget left (with a
        block size, clipped to nothing: it and the rest wait), a first chunk of one token beside
        running decodes and no running chunk padded to 1+K with K placeholder drafts (`Pad new decode
        requests`; it waits if they do not fit). Returns the step, or None when nothing could run (the
        tick passes all the same)."""
        self._settle(accepted)
        t, budget = self.tick, self.budget
        self.tick += 1
        self.calls += 1
        self._fresh = set()
        # `long_prefill_token_threshold` caps a chunk only while another request is running or waiting
        eligible = len(self._running) + sum(r.arrive <= t for r in self._waiting)
        cap = self.config.long_prefill_token_threshold if eligible > 1 else 0
        wide = min(budget, self.config.long_prefill_token_threshold or budget)  # `_mamba_block_aligned_split`
        rows: list[tuple[_Req, int, bool, int]] = []  # (request, query length, is a decode, drafts)
        budget = self._schedule_running(rows, budget, cap, wide)
        running = len(rows)
        self._schedule_waiting(rows, budget, t, cap, wide)
        if not rows:
            return None
        return self._emit(rows, t, running)

    def dummy(self, accepted: Mapping[int, int] | None = None) -> StepBatch:
        """One tick of an idle data-parallel rank: the other ranks run a step, this one runs
        `_dummy_run(1+K, uniform_decode=True)` (`vllm/v1/worker/gpu_worker.py:
        Worker.execute_dummy_batch`), with no requests. Only on a data-parallel rank with nothing
        to run."""
        if not self.data_parallel:
            raise BadInput("a dummy step needs data_parallel (only an idle data-parallel rank runs one)")
        if not self.idle():
            raise BadInput(f"tick {self.tick}: a dummy step while requests can run")
        self._settle(accepted)
        self.tick += 1
        b = StepBatch([], [], [], [], [], step=self.emitted, live_slots=self.owned(), num_computed=[],
                      prompt_lens=[], draft_lens=[], num_accepted=[], blocks=[], finished=self._finished, dummy=True,
                      post_copies=self._take_post())
        self._finished = []
        self.emitted += 1
        return b

    # -- inside ---------------------------------------------------------------------------------

    def _schedule_running(self, rows: list, budget: int, cap: int, wide: int) -> int:
        """The running requests' rows, in the order admitted (`step`); returns the budget left."""
        k, bs = self.spec_tokens, self.block_size
        for r in self._running:
            if budget <= 0:
                break
            if r.num_computed >= r.target:
                n = min(decode_len(k), budget)
                self._schedule(rows, (r, n, True, n - 1))
            else:
                n = min(r.target - r.num_computed, cap or budget, budget)
                if bs:
                    n = aligned_chunk(r.num_computed, n, r.target, bs, wide, r.prompt_len, r.junction)
                    if n == 0:
                        continue
                self._schedule(rows, (r, n, False, 0))
            budget -= n
        return budget

    def _schedule_waiting(self, rows: list, budget: int, t: int, cap: int, wide: int) -> None:
        """The waiting requests admitted this step and their first chunks, in order (`step`)."""
        k, bs = self.spec_tokens, self.block_size
        running, chunked = len(rows), any(not decode for _, _, decode, _ in rows)
        for r in list(self._waiting):
            if r.arrive > t or (len(self._running) >= self.max_seqs if bs else len(self.free) < decode_len(k)):
                continue
            if budget <= 0:
                break
            tokens = self._tokens(r, r.prefill_len()) if bs else []
            hit, block = self.pool.longest_hit(tokens, bs) if bs else (-1, None)
            if block is not None and block in self._fresh:
                break  # a hit on a block this step fills waits for the next (`MambaManager.get_num_blocks_to_allocate`)
            start = (hit + 1) * bs if block is not None else 0
            junction = self.pool.shared(tokens, bs) if bs else 0
            r.junction = junction if junction > start else 0
            need = r.prefill_len() - start
            n, pad = min(need, cap or need, budget), 0  # cut by the threshold, then chunked to the budget left
            if k and need == 1 and not chunked and (running or start):
                if decode_len(k) > budget:
                    break
                n, pad = decode_len(k), k
            if bs:
                n = aligned_chunk(start, n, r.prefill_len(), bs, wide, r.prompt_len, r.junction)
                if n == 0:
                    break  # clipped to nothing (`_mamba_block_aligned_split`): it waits (FCFS)
                if pad and n != decode_len(k):
                    n, pad = 1, 0
                self._admit_aligned(r, hit, block)
            else:
                self._admit(r, r.prefill_len())
            self._schedule(rows, (r, n, False, pad))
            budget -= n

    def _schedule(self, rows: list, row: tuple) -> None:
        """A row of the step; with a block size its blocks are placed and what its tokens fill cached
        as vLLM allocates them, in the order scheduled (`KVCacheManager.allocate_slots`)."""
        rows.append(row)
        r, q, decode, d = row
        if self.block_size:
            self._place(r, q)
            self._cache_kept(r, r.num_computed + (1 if decode else q - d))  # a decode keeps its first token
