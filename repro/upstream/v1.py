"""vLLM's V1 model runner's decisions around the islands (`vllm/v1/worker/gpu_model_runner.py:
GPUModelRunner`), made by its own code: a control path (`repro.capture.control`) whose every answer
comes from the installed vLLM, patches included.

The runner itself cannot be built here (its `__init__` makes CUDA streams and device buffers), so
`bare_runner` makes an instance without it and sets the attributes the methods called below read,
as `__init__` sets them. What runs as vLLM wrote it:

- `InputBatch` and `BlockTable` (`gpu_input_batch.py`, `block_table.py`): `add_request`,
  `remove_request`, `condense`, `refresh_metadata`, `append_row`, `add_row`, `commit_block_table`,
  and `reorder_batch_to_split_decodes_and_prefills` (`_may_reorder_batch`);
- the draft bookkeeping of `_prepare_inputs` (`runner.draft_counts`'s lines of the wheel's source)
  over that persistent batch;
- `GPUModelRunner._determine_batch_execution_and_padding` on the bare instance: the uniform-decode
  decision (`_is_uniform_decode`, or a patch's form of it) and `CudagraphDispatcher.dispatch`;
- `GDNAttentionMetadataBuilder.build` and `build_for_cudagraph_capture`, over its own persistent
  buffers (`builder.Builder`).

What is rebuilt here, because it lives inside methods that also launch kernels or need a device
(each step cites the lines it follows):

- `update`: the persistent-batch half of `_update_states` (finished, preempted and unscheduled
  requests leave, new and resumed ones are added with their prompt, computed tokens and blocks,
  running ones get their computed count and new blocks; condense, reorder, refresh);
- `dispatch`: `execute_model`'s call of `_determine_batch_execution_and_padding` (the row-order
  token counts), and `_dummy_run`'s (`force_uniform_decode=True`);
- `metadata`, `capture_metadata`, `dummy`: the `CommonAttentionMetadata` `_build_attention_metadata`
  fills (rows, padding rows of the null block, `is_prefilling` from `num_computed_tokens_cpu <
  num_prompt_tokens`, optimistic sequence lengths), after `commit_block_table` where vLLM commits.

Rows: vLLM lays a step out in its persistent batch's order (decodes first, `_may_reorder_batch`);
the suite's step lists its requests decodes first too, and the path gathers each request's row of
vLLM's arrays and committed block table into the step's order, so the islands and the eager copy
see the same requests in the same order. The builder's classes and staging depend on the rows'
kinds, not their positions, once decodes lead; a dummy run reads vLLM's rows as they lie.
"""
from __future__ import annotations

import types

import numpy as np

from ..control.batch import block_rows
from ..control.dispatch import BatchDescriptor
from ..errors import ReplayRefused
from ..knobs.modes import MODES, Runtime
from .builder import Builder
from .dispatch import Dispatcher, descriptor, runtime
from .input_batch import InputBatch
from .metadata import NULL_BLOCK_ID, common, gdn_meta
from .runner import _bookkeeping, draft_counts
from ..control.shape import decode_len


def bare_runner(up, cfg, input_batch, dispatcher):
    """A `GPUModelRunner` without `__init__`, holding what `_determine_batch_execution_and_padding`,
    `_is_uniform_decode` (a patch's form reads `self.input_batch`) and `_allow_microbatching` read,
    set as `__init__` sets them (`uniform_decode_query_len = 1 + self.num_spec_tokens`)."""
    r = object.__new__(up.gpu_model_runner.GPUModelRunner)
    r.vllm_config, r.model_config, r.parallel_config = cfg, cfg.model_config, cfg.parallel_config
    r.scheduler_config, r.cache_config, r.speculative_config = cfg.scheduler_config, cfg.cache_config, \
        cfg.speculative_config
    r.num_spec_tokens = cfg.num_speculative_tokens
    r.uniform_decode_query_len = decode_len(r.num_spec_tokens)
    r.input_batch, r.cudagraph_dispatcher = input_batch, dispatcher
    return r


def refused(step: int, e: AssertionError) -> ReplayRefused:
    """vLLM's own assertion (or a patch's: vLLM PR #55123's) stopped the step: a loud error."""
    return ReplayRefused(f"step {step}: vLLM's runner raised AssertionError: {e}")


class V1Path:
    """The V1 runner's control path under `cfg` (module docstring); `device`: where the builder's
    persistent buffers live (the replay copy's device)."""

    source = "vllm"

    def __init__(self, up, cfg, device):
        self.up, self.cfg, self.k = up, cfg, cfg.num_speculative_tokens
        self.dispatcher = Dispatcher(up, cfg)
        self.mode, self.sizes = MODES[self.dispatcher.mode.name], self.dispatcher.sizes
        self.ib = InputBatch(up, cfg)
        self.batch = self.ib.batch
        self.builder = Builder(up, cfg, device)
        self.runner = bare_runner(up, cfg, self.batch, self.dispatcher.dispatcher)
        self.requests: dict[str, object] = {}  # `GPUModelRunner.requests`: every request's cached state
        self.threshold = self.builder.builder.reorder_batch_threshold  # `calculate_reorder_batch_threshold`
        self.block_size = cfg.cache_config.mamba_block_size if cfg.cache_config.mamba_cache_mode == "align" else None
        self._bookkeeping = _bookkeeping(up.gpu_model_runner.GPUModelRunner._prepare_inputs, up.draft_anchors)

    # ---- `_update_states` -------------------------------------------------------------------
    def _state(self, rid: str, prompt: int, prefill: int, computed: int, blocks: list[int]):
        """A `CachedRequestState` as `_update_states` makes one from `NewRequestData`; a resumed
        request's kept tokens are its output tokens (`req_state.output_token_ids`)."""
        sp = self.up.sampling_params.SamplingParams(temperature=0.0)
        return self.up.gpu_input_batch.CachedRequestState(
            req_id=rid, prompt_token_ids=[0] * prompt, mm_features=[], sampling_params=sp, generator=None,
            block_ids=(list(blocks),), num_computed_tokens=computed, output_token_ids=[0] * (prefill - prompt))

    def update(self, batch) -> None:
        """`_update_states` (module docstring). A request in `batch.finished` that is scheduled again
        was preempted: vLLM resumes it (`resumed_req_ids`: removed, its block ids replaced, added).
        New requests are added first, in the order the scheduler admitted them (`scheduled_new_reqs`:
        first come first served; a step does not say it, and the suite's requests are numbered in
        arrival order), then the cached ones it re-adds, in the step's order.
        A dummy step schedules nothing: before an idle rank's `execute_dummy_batch`, its engine ran
        `execute_model` on the empty schedule that delivers the finished requests
        (`EngineCore.step` runs while `scheduler.has_requests()`, finished ones included), and
        `_update_states` removed every row of the persistent batch."""
        ib = self.batch
        scheduled = [str(r) for r in batch.request_ids]
        resumed = set(map(str, batch.finished)) & set(scheduled)
        for rid in [r for r in ib.req_id_to_index if r not in scheduled or r in resumed]:
            ib.remove_request(rid)  # finished, preempted or unscheduled (`unscheduled_req_ids`)
        fresh, add = [], []  # vLLM adds `scheduled_new_reqs` first, then the cached requests it re-adds
        for rid, blocks, computed, prompt, prefill in zip(scheduled, batch.block_rows(), batch.computed(),
                                                          batch.prompts(), batch.prefills()):
            blocks = [int(b) for b in blocks]
            state = self.requests.get(rid)
            if state is None:  # `scheduled_new_reqs`
                state = self.requests[rid] = self._state(rid, prompt, prefill, computed, blocks)
                fresh.append(state)
                continue
            if rid in resumed:  # resumed from preemption: its block ids replaced
                state = self.requests[rid] = self._state(rid, prompt, prefill, computed, blocks)
                add.append(state)
                continue
            state.num_computed_tokens = computed
            old = state.block_ids[0]
            new = blocks[len(old):] if blocks[:len(old)] == old else None
            state.block_ids = (blocks,)
            idx = ib.req_id_to_index.get(rid)
            if idx is None:  # not in the persistent batch (unscheduled last step): added again
                add.append(state)
                continue
            ib.num_computed_tokens_cpu[idx] = computed
            if new:
                ib.block_table.append_row((new,), idx)
            elif new is None:  # the suite's scheduler nulled a retired column: the row as the copies read it
                ib.block_table.add_row((blocks,), idx)
        fresh.sort(key=lambda st: int(st.req_id))  # the scheduler admits in arrival order: the suite's ids
        for state in fresh + add:
            ib.add_request(state)
        ib.condense()
        if self.threshold is not None:  # `_may_reorder_batch`
            out = types.SimpleNamespace(num_scheduled_tokens=dict(zip(scheduled, batch.query_lens)))
            self.up.backend_utils.reorder_batch_to_split_decodes_and_prefills(ib, out, decode_threshold=self.threshold)
        ib.refresh_metadata()

    def _rows(self, batch) -> list[int]:
        return [self.batch.req_id_to_index[str(r)] for r in batch.request_ids]

    # ---- `_prepare_inputs` and `_determine_batch_execution_and_padding` ----------------------
    def _row_counts(self, batch) -> np.ndarray:
        """The step's scheduled tokens in the persistent batch's row order (`execute_model`)."""
        q = np.zeros(self.batch.num_reqs, dtype=np.int32)
        q[self._rows(batch)] = batch.query_lens
        return q

    def draft_counts(self, batch) -> np.ndarray:
        """`num_decode_draft_tokens` of the step's requests, in the step's order: `_prepare_inputs`'s
        bookkeeping over vLLM's persistent batch (rows), gathered by request."""
        spec = {str(r): [0] * d for r, d in zip(batch.request_ids, batch.drafts()) if d > 0}
        fn, q = self._bookkeeping, self._row_counts(batch)
        rows = fn(types.SimpleNamespace(input_batch=self.batch), types.SimpleNamespace(scheduled_spec_decode_tokens=spec),
                  q, len(q), np)
        return np.asarray(rows)[self._rows(batch)]

    def _determine(self, step: int, **kw) -> tuple[Runtime, BatchDescriptor]:
        try:
            mode, desc, *_ = self.runner._determine_batch_execution_and_padding(use_cascade_attn=False, **kw)
        except AssertionError as e:
            raise refused(step, e) from None
        return runtime(mode), descriptor(desc)

    def dispatch(self, batch) -> tuple[Runtime, BatchDescriptor]:
        """`execute_model`'s call (its arguments in row order), or a dummy step's: `_dummy_run(1+k,
        uniform_decode=True)` forces the flag."""
        if batch.dummy:
            q = decode_len(self.k)
            return self._determine(batch.step, num_tokens=q, num_reqs=1, num_scheduled_tokens_np=np.array([q]),
                                   max_num_scheduled_tokens=q, force_uniform_decode=True)
        q = self._row_counts(batch)
        return self._determine(batch.step, num_tokens=int(q.sum()), num_reqs=len(q), num_scheduled_tokens_np=q,
                               max_num_scheduled_tokens=int(q.max()), num_encoder_reqs=0,
                               allow_microbatching=self.runner._allow_microbatching(len(q), q))

    def refusal(self, batch, runtime: Runtime, desc: BatchDescriptor) -> str | None:
        """vLLM's own refusals are raised in `dispatch` (a patch's assertion there included)."""
        return None

    # ---- `_build_attention_metadata` --------------------------------------------------------
    def metadata(self, batch, runtime: Runtime, desc: BatchDescriptor, accepted=None):
        """`_prepare_inputs` commits the block table (`commit_block_table(num_reqs)`); then the rows
        `_build_attention_metadata` builds over (a FULL step: `desc.num_reqs` rows, the padded ones
        the null block), gathered into the step's order."""
        ib, rows = self.batch, self._rows(batch)
        ib.block_table.commit_block_table(ib.num_reqs)
        full = runtime is Runtime.FULL
        computed, prompts = ib.num_computed_tokens_cpu[rows], ib.num_prompt_tokens[rows]
        c = common(batch.query_lens, computed, computed < prompts, self.draft_counts(batch),
                   batch.accepted() if accepted is None else accepted, self.ib.committed[rows],
                   desc.num_tokens if full else batch.num_tokens, self.block_size,
                   desc.num_reqs - batch.num_reqs if full else 0)
        return gdn_meta(self.builder.build(c))

    def _dummy_rows(self, desc: BatchDescriptor, num_tokens: int) -> tuple[list[int], int]:
        """`_dummy_run(num_tokens, uniform_decode=True)`'s requests: `min(max_num_seqs,
        cdiv(num_tokens, 1+k))` of 1+k tokens (the last the remainder), padded to `desc.num_reqs`."""
        q = decode_len(self.k)
        n = min(self.cfg.scheduler_config.max_num_seqs, -(-num_tokens // q))
        lens = [q] * n
        if num_tokens % q:
            lens[-1] = num_tokens % q
        return lens, (desc.num_reqs or n) - n

    def capture_metadata(self, desc: BatchDescriptor):
        """`_dummy_run(desc.num_tokens, FULL, uniform_decode=True, is_graph_capturing=True)` at
        start-up: the persistent batch is empty (block table all null, nothing prefilling), sequence
        lengths are the query length, and the builder builds as for capture."""
        lens, pad = self._dummy_rows(desc, desc.num_tokens)
        q = max(lens)
        blocks = np.full((len(lens), self.ib.width), NULL_BLOCK_ID, dtype=np.int32)
        c = common(lens, [q - x for x in lens], [False] * len(lens), [x - 1 for x in lens], lens, blocks,
                   desc.num_tokens, self.block_size, pad)
        return gdn_meta(self.builder.build_for_capture(c))

    def dummy(self, desc: BatchDescriptor) -> None:
        """A FULL dummy step (`_dummy_run(1+k, uniform_decode=True)`): `commit_block_table(num_reqs_padded)`,
        then the metadata for capture over the persistent batch's first rows as they lie
        (`_build_attention_metadata(num_reqs=num_reqs_padded, for_cudagraph_capture=True)`:
        `is_prefilling` from those rows' counts)."""
        ib = self.batch
        lens, pad = self._dummy_rows(desc, decode_len(self.k))
        n = len(lens) + pad
        ib.block_table.commit_block_table(n)
        q = max(lens)
        c = common(lens + [0] * pad, [q - x for x in lens] + [0] * pad,
                   ib.num_computed_tokens_cpu[:n] < ib.num_prompt_tokens[:n], [x - 1 for x in lens] + [-1] * pad,
                   lens + [1] * pad, self.ib.committed[:n], desc.num_tokens, self.block_size)
        self.builder.build_for_capture(c)

    def pad_state_indices(self, batch, desc: BatchDescriptor) -> list[int]:
        """What vLLM's persistent state-index buffer holds in this FULL step's padded rows."""
        b = self.builder.builder
        buf = b.spec_state_indices_tensor[:, 0] if self.k else b.non_spec_state_indices_tensor
        return buf[batch.num_reqs:desc.num_reqs].tolist()


class V1EagerPath:
    """The eager copy's metadata under the V1 runner (and the oracle's padded eager run's): vLLM's
    builder under a `cudagraph_mode=NONE` config (it never stages), over the step's own block rows,
    `is_prefilling` and the draft bookkeeping of `_prepare_inputs` over the step alone
    (`runner.draft_counts`)."""

    source = "vllm"

    def __init__(self, up, cfg, device):
        self.up, self.k = up, cfg.num_speculative_tokens
        self.builder = Builder(up, cfg, device)
        cache = cfg.cache_config
        self.block_size = cache.mamba_block_size if cache.mamba_cache_mode == "align" else None

    def metadata(self, batch, accepted=None, pad_rows: int = 0, size: int | None = None):
        computed, prompts = batch.computed(), batch.prompts()
        c = common(batch.query_lens, computed, [c < p for c, p in zip(computed, prompts)],
                   draft_counts(self.up, batch.query_lens, batch.drafts(), computed, prompts),
                   batch.accepted() if accepted is None else accepted, block_rows(batch, decode_len(self.k), NULL_BLOCK_ID),
                   batch.num_tokens if size is None else size, self.block_size, pad_rows)
        return gdn_meta(self.builder.build(c))
