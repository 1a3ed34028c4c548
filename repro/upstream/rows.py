"""The V1 runner's side of a step: a `SchedulerOutput` becomes per-request rows in the runner's order,
with the accepted counts and, with a block size, the state columns and boundary copies the runner
derives (what `repro.upstream.schedule` turns into a `StepBatch`).

The runner (`vllm/v1/worker/gpu_model_runner.py: GPUModelRunner`) cannot be built on a CPU, so the
lines of it that decide these are rebuilt here, each on vLLM's own `InputBatch` (the seam's
`input_batch.InputBatch`, the GDN group's table) and calling vLLM's free functions where there are:

- `update` is `GPUModelRunner._update_states` for what a row needs: finished requests and every
  request not scheduled in the step leave the persistent batch (a resumed one too, as the force-
  preempted case there says); new and resumed requests are added as `CachedRequestState`s (lowest
  empty row first); a running request's `num_computed_tokens` and new state blocks (appended: the
  runner's block table is append-only) are written into its row; then `condense` and
  `_may_reorder_batch`, which is `reorder_batch_to_split_decodes_and_prefills`
  (`vllm/v1/attention/backends/utils.py`) with the GDN builder's `reorder_batch_threshold` (the
  only backend of the model that sets one: FlashAttention leaves it None).
- `columns` is the decision half of `vllm/v1/worker/mamba_utils.py: preprocess_mamba` (mode
  "align"): `cleanup_mamba_state_idx`, then each row's previous state column (its last step's, or
  `(num_computed - 1) // block_size` for a new or resumed request) and its running column
  `cdiv(num_computed + num_scheduled, block_size) - 1`.
- `after` is `GPUModelRunner._update_states_after_model_execute` (speculative decoding only): each
  row's accepted count becomes the tokens it kept (1 for a row without drafts), and in mode "align"
  the decision of `postprocess_mamba_fused_kernel` (a Triton kernel; its decision lines) saves the
  block-boundary state the kept tokens reached, `[dst, conv_src, conv_offset, ssm_src]` block ids
  as `_copy_mamba_state_block` reads them, and sets the accepted count to 1 where that boundary is
  the running column itself.
"""
from __future__ import annotations

from .builder import Builder
from .input_batch import InputBatch

GDN_GROUP = 1  # the state group's index in `config.kv_cache_config` (attention first)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Rows:
    """One V1 runner's persistent batch and the per-step decisions above (module docstring)."""

    def __init__(self, up, cfg):
        self.up, self.cfg = up, cfg
        self.batch = InputBatch(up, cfg).batch
        self.threshold = Builder(up, cfg).builder.reorder_batch_threshold
        self.k = cfg.num_speculative_tokens
        self.block_size = cfg.cache_config.mamba_block_size if cfg.cache_config.mamba_cache_mode == "align" else None
        self.states: dict[str, object] = {}  # req_id -> CachedRequestState (`GPUModelRunner.requests`)
        self.state_idx: dict[str, int] = {}  # `GPUModelRunner.mamba_state_idx`

    def order(self) -> list[str]:
        return list(self.batch.req_ids)

    def blocks(self, rid: str) -> list[int]:
        """The request's state blocks as the runner's block table row holds them."""
        return list(self.states[rid].block_ids[0])

    def num_computed(self, rid: str) -> int:
        return int(self.batch.num_computed_tokens_cpu[self.batch.req_id_to_index[rid]])

    def accepted(self, rid: str) -> int:
        return int(self.batch.num_accepted_tokens_cpu[self.batch.req_id_to_index[rid]])

    def _state(self, new) -> object:
        sp = self.up.sampling_params.SamplingParams(temperature=0.0)
        return self.up.gpu_input_batch.CachedRequestState(
            req_id=new.req_id, prompt_token_ids=list(new.prompt_token_ids), mm_features=[], sampling_params=sp,
            generator=None, block_ids=(list(new.block_ids[GDN_GROUP]),), num_computed_tokens=new.num_computed_tokens,
            output_token_ids=[])

    def update(self, out) -> None:
        """`_update_states` (module docstring)."""
        b = self.batch
        for rid in out.finished_req_ids:
            self.states.pop(rid, None)
            b.remove_request(rid)
        cached = out.scheduled_cached_reqs
        resumed = cached.resumed_req_ids
        for rid in set(b.req_id_to_index) - (set(out.num_scheduled_tokens) - resumed):
            b.remove_request(rid)
        add = []
        for new in out.scheduled_new_reqs:
            self.states[new.req_id] = state = self._state(new)
            add.append(state)
        for i, rid in enumerate(cached.req_ids):
            state = self.states[rid]
            state.num_computed_tokens = cached.num_computed_tokens[i]
            new_ids = cached.new_block_ids[i]
            if rid in resumed:
                state.block_ids = (list(new_ids[GDN_GROUP]),)
            elif new_ids is not None:
                state.block_ids[0].extend(new_ids[GDN_GROUP])
            row = b.req_id_to_index.get(rid)
            if row is None:
                add.append(state)
                continue
            b.num_computed_tokens_cpu[row] = state.num_computed_tokens
            if new_ids is not None:
                b.block_table.append_row((new_ids[GDN_GROUP],), row)
        for state in add:
            b.add_request(state)
        b.condense()
        if self.threshold is not None:
            self.up.backend_utils.reorder_batch_to_split_decodes_and_prefills(b, out, decode_threshold=self.threshold)
        b.refresh_metadata()

    def columns(self, out) -> dict[str, tuple[int, int]]:
        """`preprocess_mamba`'s decision (module docstring): rid -> (previous column, running column)."""
        gone = set(out.finished_req_ids) | set(out.preempted_req_ids or ()) | set(out.scheduled_cached_reqs.resumed_req_ids)
        for rid in gone:
            self.state_idx.pop(rid, None)
        cols = {}
        for rid in self.order():
            c, q = self.states[rid].num_computed_tokens, out.num_scheduled_tokens[rid]
            prev = self.state_idx.get(rid, (c - 1) // self.block_size)
            self.state_idx[rid] = cdiv(c + q, self.block_size) - 1
            cols[rid] = (prev, self.state_idx[rid])
        return cols

    def after(self, out, kept: dict[str, int]) -> list[list[int]]:
        """`_update_states_after_model_execute` (module docstring): `kept` is each row's kept token
        count. Returns the boundary copies the step queued (mode "align")."""
        if not self.k:
            return []
        copies = []
        for i, rid in enumerate(self.order()):
            a = kept[rid]
            self.batch.num_accepted_tokens_cpu[i] = a
            if self.block_size is None:
                continue
            bs = self.block_size
            drafts = len(out.scheduled_spec_decode_tokens.get(rid, ()))
            running = self.states[rid].num_computed_tokens + out.num_scheduled_tokens[rid] - drafts
            aligned = (running + a - 1) // bs * bs
            if aligned < running:
                continue
            bias, src, dest = aligned - running, self.state_idx[rid], aligned // bs - 1
            if src == dest:
                self.batch.num_accepted_tokens_cpu[i] = 1
                if bias == 0:
                    continue
            row = self.blocks(rid)
            copies.append([row[dest], row[src], bias, row[src + bias]])
        return copies
