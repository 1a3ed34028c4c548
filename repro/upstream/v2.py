"""vLLM's V2 model runner's decisions around the islands (`vllm/v1/worker/gpu/`: 0.33.0's default
runner where Triton is present, 0.34.0's only one), made by its own code where it runs on the host.

What runs as vLLM wrote it, on stand-ins for the runner's `self` (`runner_view`, `model_state`):

- `GPUModelRunner.gather_batch_req_state` (`gpu/model_runner.py`): the batch's order
  (`sort_batch_req_ids`), each request's prefill phase (`num_computed_prefill_tokens < prefill_len`,
  a resumed request's recompute included), the rows that run as decodes, `decode_graph_eligible`,
  and `get_uniform_decode_token_count` (`v1/worker/utils.py`);
- `dispatch_cg_and_sync_dp` (`gpu/dp_utils.py`) over a real `CudaGraphManager`
  (`gpu/cudagraph_utils.py`: its candidate keys from the capture sizes as V2 resolves them, and
  `dispatch`);
- `MambaHybridModelState.prepare_attn` (`gpu/model_states/mamba_hybrid.py`): `is_prefilling`, the
  draft counts and accepted counts the GDN builder reads, then `build_attn_metadata`
  (`gpu/attn_utils.py`) and `GDNAttentionMetadataBuilder.build` / `build_for_cudagraph_capture`
  over its persistent buffers.

What needs Triton or a device, and is rebuilt here (each cites what it follows):

- the request states `gather_batch_req_state` reads (`RequestState`: its staged writes apply through
  a Triton kernel): per step from the suite's step, `prefill_len` the tokens the new-request data
  carries (`RequestState.add_request`: `len(all_token_ids)`, the prompt and, after a preemption,
  every token kept before it) and `num_computed_prefill_tokens = min(num_computed, prefill_len)`
  (`update_requests`);
- the block tables (`BlockTables.gather_block_tables`, a Triton kernel): each request's row, padded
  rows zero; a dummy run's and a capture's rows zero (`get_dummy_block_tables`);
- the step's input batch fields `prepare_inputs` fills (query start locations, sequence lengths,
  padding: `InputBatch.make_dummy` for dummy and capture batches).

Rows are gathered into the suite's step order, as `v1.V1Path` does (V2 lays its batch out drafted
requests first, `sort_batch_req_ids`); the classes do not depend on positions.
"""
from __future__ import annotations

import tempfile
import types

import numpy as np
import torch

from ..control.batch import block_rows
from ..control.dispatch import BatchDescriptor
from ..knobs.modes import MODES, Runtime
from .builder import Builder
from .config import kv_cache_config, mamba_spec
from .metadata import NULL_BLOCK_ID, gdn_meta
from ..control.shape import decode_len


def single_rank(up, cfg) -> None:
    """vLLM's process groups for a world of one (gloo), as a one-GPU engine has them: the V2 runner's
    graph manager asks the pipeline group whether it is the first and last rank."""
    ps = up.parallel_state
    if ps.model_parallel_is_initialized():
        return
    with up.config.set_current_vllm_config(cfg):
        ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                        distributed_init_method=f"file://{tempfile.mkdtemp()}/init")
        ps.initialize_model_parallel(1, 1)


def runner_view(up, batch, q: int):
    """What `gather_batch_req_state` reads of the runner and the scheduler output for the suite's
    `batch` (module docstring: the request states rebuilt from the step): (self, scheduler_output)."""
    rids = [str(r) for r in batch.request_ids]
    prefill = np.asarray(batch.prefills(), dtype=np.int32)
    computed = np.asarray(batch.computed(), dtype=np.int32)
    states = types.SimpleNamespace(req_id_to_index={r: i for i, r in enumerate(rids)},
                                   prefill_len=types.SimpleNamespace(np=prefill),
                                   num_computed_prefill_tokens=np.minimum(computed, prefill),
                                   max_seq_len=prefill)
    runner = types.SimpleNamespace(req_states=states, decode_query_len=q, use_pp=False, adaptive_verification=None,
                                   pcp_manager=None)
    out = types.SimpleNamespace(num_scheduled_tokens=dict(zip(rids, batch.query_lens)),
                                total_num_scheduled_tokens=batch.num_tokens,
                                scheduled_spec_decode_tokens={r: [0] * d for r, d in zip(rids, batch.drafts()) if d})
    return runner, out


def model_state(up, cfg, accepted: np.ndarray):
    """A `MambaHybridModelState` without `__init__`: what `prepare_attn` reads, as `__init__` sets it
    (`num_accepted_tokens_gpu` per request index: here the step's requests in order)."""
    s = object.__new__(up.v2_mamba.MambaHybridModelState)
    s.vllm_config, s.model_config, s.cache_config = cfg, cfg.model_config, cfg.cache_config
    s.num_accepted_tokens_gpu = torch.as_tensor(accepted, dtype=torch.int32)
    s._align_mode = cfg.cache_config.mamba_cache_mode == "align"
    s._mamba_spec, s._mamba_group_ids, s._mamba_ctx, s.recoverssm = None, [], None, None
    return s


class V2Attention:
    """`prepare_attn` over vLLM's GDN builder under `cfg` (module docstring): one step's metadata."""

    def __init__(self, up, cfg, device):
        self.up, self.cfg, self.k = up, cfg, cfg.num_speculative_tokens
        self.builder = Builder(up, cfg, device)
        self.kv = kv_cache_config(up, cfg, 1)
        group = up.worker_utils.AttentionGroup(backend=up.gdn_attn.GDNAttentionBackend, layer_names=["gdn"],
                                               kv_cache_spec=mamba_spec(up, cfg), kv_cache_group_id=1,
                                               metadata_builders=[self.builder.builder])
        self.groups = [[], [group]]  # the attention group's layers are not the islands'

    def build(self, lens, computed, blocks: np.ndarray, state, drafts, accepted, num_reqs: int, num_tokens: int,
              cg_mode, for_capture: bool, max_query_len=None):
        """`prepare_attn(input_batch, cg_mode, ...)` for a batch of `lens` (live rows), `num_reqs` and
        `num_tokens` after padding; `state`: (is_prefilling, prefill_runs_as_decode) of the live rows."""
        n, live = num_reqs, len(lens)
        q = np.zeros(n, dtype=np.int32)
        q[:live] = lens
        qsl = np.concatenate(([0], np.cumsum(q))).astype(np.int32)
        seq = torch.zeros(n, dtype=torch.int32)
        seq[:live] = torch.as_tensor(np.asarray(computed) + np.asarray(lens), dtype=torch.int32)
        rows = np.full((n, blocks.shape[1]), NULL_BLOCK_ID, dtype=np.int32)
        rows[:live] = blocks
        batch = types.SimpleNamespace(
            num_reqs=live, num_reqs_after_padding=n, num_tokens=int(q.sum()), num_tokens_after_padding=num_tokens,
            query_start_loc_np=qsl, query_start_loc=torch.from_numpy(qsl.copy()), max_query_len=max_query_len,
            num_scheduled_tokens=q[:live], seq_lens=seq, seq_lens_cpu_upper_bound=seq.clone(), dcp_local_seq_lens=None,
            is_prefilling_np=np.asarray(state[0], dtype=bool), prefill_runs_as_decode_np=state[1],
            num_draft_tokens_per_req=None if drafts is None else np.asarray(drafts, dtype=np.int32),
            idx_mapping=torch.arange(live), positions=None, prompt_lens=None)
        tables = (torch.zeros((n, 1), dtype=torch.int32), torch.from_numpy(rows))
        slots = torch.full((2, num_tokens), -1, dtype=torch.int64)
        meta = model_state(self.up, self.cfg, accepted).prepare_attn(batch, cg_mode, tables, slots, self.groups,
                                                                     self.kv, for_capture=for_capture)
        return gdn_meta(meta["gdn"])


class V2Path:
    """The V2 runner's control path under `cfg` (module docstring)."""

    source = "vllm-v2"

    def __init__(self, up, cfg, device):
        self.up, self.cfg, self.k = up, cfg, cfg.num_speculative_tokens
        self.q = decode_len(self.k)
        single_rank(up, cfg)
        cc = cfg.compilation_config
        support = up.gdn_attn.GDNAttentionMetadataBuilder.get_cudagraph_support(cfg, mamba_spec(up, cfg))
        vmode = cc.resolve_cudagraph_mode_and_sizes(support, "GDNAttentionBackend", self.q, use_v2_model_runner=True)
        self.mode = MODES[vmode.name]
        self.sizes = tuple(cc.cudagraph_capture_sizes or ()) if vmode.name != "NONE" else ()
        self.manager = up.v2_cudagraph.CudaGraphManager(cfg, torch.device(device), vmode, self.q)
        self.manager._graphs_captured = True  # the suite captures each key when a step first needs it
        self.attention = V2Attention(up, cfg, device)
        self.builder = self.attention.builder
        self.last = None  # the last step's (batch, its gathered state)

    def update(self, batch) -> None:
        """The request states are the step's (module docstring): nothing persists between steps but
        the builder's buffers and the graph manager."""

    def _gather(self, batch):
        runner, out = runner_view(self.up, batch, self.q)
        return self.up.v2_runner.GPUModelRunner.gather_batch_req_state(runner, out, dummy_run=False)

    def _dispatch(self, num_reqs: int, num_tokens: int, uniform, max_query_len) -> tuple[Runtime, BatchDescriptor]:
        desc, _ = self.up.v2_dp.dispatch_cg_and_sync_dp(
            self.manager, num_reqs, num_tokens, uniform, 1, 0, max_query_len=max_query_len,
            parallel_config=self.cfg.parallel_config, uniform_decode=uniform == self.q)
        d = BatchDescriptor(desc.num_tokens, desc.num_reqs, desc.uniform_token_count is not None)
        return Runtime[desc.cg_mode.name], d

    def dispatch(self, batch) -> tuple[Runtime, BatchDescriptor]:
        """`execute_model`'s dispatch: `gather_batch_req_state`, then `dispatch_cg_and_sync_dp` (no
        query-length bound for a batch with a prefill); a dummy step is `_dummy_run(1,
        uniform_decode=True)`: one request of `decode_query_len` tokens, uniform by construction."""
        if batch.dummy:
            uniform = self.up.worker_utils.get_uniform_decode_token_count(1, self.q, self.q, True)
            return self._dispatch(1, self.q, uniform, self.q)
        state, uniform = self._gather(batch)
        self.last = (batch, state)
        return self._dispatch(batch.num_reqs, state.num_tokens, uniform,
                              None if state.has_prefill else max(batch.query_lens))

    def refusal(self, batch, runtime, desc) -> str | None:
        return None

    def _state(self, batch):
        if self.last is None or self.last[0] is not batch:
            self.last = (batch, self._gather(batch)[0])
        return self.last[1]

    def step_classes(self, batch):
        """(is_prefilling, prefill_runs_as_decode, drafts) of the step's requests in its order."""
        state = self._state(batch)
        order = [state.req_ids.index(str(r)) for r in batch.request_ids]
        runs = None if state.prefill_runs_as_decode_np is None else state.prefill_runs_as_decode_np[order]
        return (state.is_prefilling_np[order], runs, batch.drafts() if state.num_draft_tokens_np is not None else None)

    def metadata(self, batch, runtime: Runtime, desc: BatchDescriptor, accepted=None):
        """`prepare_attn` for the step: a FULL step over `num_reqs_after_padding` rows."""
        full = runtime is Runtime.FULL
        prefilling, runs, drafts = self.step_classes(batch)
        n = desc.num_reqs if full else batch.num_reqs
        acc = np.ones(n, dtype=np.int32)
        acc[:batch.num_reqs] = batch.accepted() if accepted is None else accepted
        return self.attention.build(batch.query_lens, batch.computed(), block_rows(batch, self.q, NULL_BLOCK_ID),
                                    (prefilling, runs), drafts, acc, n, desc.num_tokens if full else batch.num_tokens,
                                    self.up.config.CUDAGraphMode[runtime.name], for_capture=False,
                                    max_query_len=None if any(prefilling) else max(batch.query_lens))

    def _dummy(self, desc: BatchDescriptor, cg_mode):
        """`InputBatch.make_dummy(num_reqs, num_tokens)` over zeroed block tables, metadata for capture:
        an even split (the remainder one token each on the last requests), sequence length = query."""
        n = desc.num_reqs or 1
        lens = [desc.num_tokens // n + (i >= n - desc.num_tokens % n) for i in range(n)]
        blocks = np.zeros((n, self.q), dtype=np.int32)
        return self.attention.build(lens, [0] * n, blocks, (np.zeros(n, dtype=bool), None), None,
                                    np.ones(n, dtype=np.int32), n, desc.num_tokens, cg_mode, for_capture=True,
                                    max_query_len=desc.num_tokens // n if desc.uniform else None)

    def capture_metadata(self, desc: BatchDescriptor):
        """`prepare_inputs_to_capture(desc.num_reqs, desc.num_tokens, full_cudagraph=True)`: the dummy
        batch's metadata with `cg_mode=NONE` and `for_capture=True`."""
        return self._dummy(desc, self.up.config.CUDAGraphMode.NONE)

    def dummy(self, desc: BatchDescriptor) -> None:
        """A FULL dummy step (`execute_model(dummy_run=True)`): `prepare_dummy_attn`'s zeroed block
        tables, `prepare_attn(cg_mode=FULL, for_capture=True)`: the builder re-stages from null rows."""
        self._dummy(desc, self.up.config.CUDAGraphMode.FULL)

    def pad_state_indices(self, batch, desc: BatchDescriptor) -> list[int]:
        b = self.builder.builder
        buf = b.spec_state_indices_tensor[:, 0] if self.k else b.non_spec_state_indices_tensor
        return buf[batch.num_reqs:desc.num_reqs].tolist()


class V2EagerPath:
    """The eager copy's metadata under the V2 runner (and the oracle's padded eager run's):
    `gather_batch_req_state` over the step alone (`runner_view`) and `prepare_attn` over a builder of
    a `cudagraph_mode=NONE` config, which never stages; the step's own block rows."""

    source = "vllm-v2"

    def __init__(self, up, cfg, device):
        self.up, self.q = up, decode_len(cfg.num_speculative_tokens)
        self.attention = V2Attention(up, cfg, device)

    def metadata(self, batch, accepted=None, pad_rows: int = 0, size: int | None = None):
        runner, out = runner_view(self.up, batch, self.q)
        state, _ = self.up.v2_runner.GPUModelRunner.gather_batch_req_state(runner, out, dummy_run=False)
        order = [state.req_ids.index(str(r)) for r in batch.request_ids]
        runs = None if state.prefill_runs_as_decode_np is None else state.prefill_runs_as_decode_np[order]
        n = batch.num_reqs + pad_rows
        acc = np.ones(n, dtype=np.int32)
        acc[:batch.num_reqs] = batch.accepted() if accepted is None else accepted
        mode = self.up.config.CUDAGraphMode.FULL if pad_rows else self.up.config.CUDAGraphMode.NONE
        return self.attention.build(batch.query_lens, batch.computed(), block_rows(batch, self.q, NULL_BLOCK_ID),
                                    (state.is_prefilling_np[order], runs),
                                    batch.drafts() if state.num_draft_tokens_np is not None else None, acc, n,
                                    batch.num_tokens if size is None else size, mode, for_capture=False)
