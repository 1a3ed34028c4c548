"""The GDN metadata builder (`vllm/v1/attention/backends/gdn_attn.py: GDNAttentionMetadataBuilder`).

`build(common)` classes each row and lays out what the GDN core reads (`meta.GDNMeta`):
- spec rows are rows whose draft-token count is >= 0 (the runner sets -1 for prefill chunks); with
  none (or k = 0) every row is non-spec;
- non-spec rows: one-token rows are decodes, except (`ControlRules.first_chunk`, vLLM #51565) a
  request's first chunk with no prior state, which is a prefill; vLLM 0.26.0 called every one-token
  row a decode (`split_decodes_and_prefills(m, decode_threshold=1)`);
- beside spec rows, one-token non-spec rows are prefills (`build`'s spec branch);
- state indices come from the block table: column 0 for non-spec rows, columns 0..k for spec rows;
  with a block size (prefix caching, mode "align") the 1+k columns from each row's running column
  `(seq_len - 1) // block_size` instead (`control.prefix.state_block_columns`).

For FULL graphs (`full_graphs`: the mode has FULL graphs) the builder keeps persistent buffers of
`decode_cudagraph_max_bs` rows (`staging_rows`: min(max_num_seqs * (1+k), the largest capture size
after rounding)), and refreshes them ONLY in its two decode staging branches (`_stage_spec_decode`: no
prefills, no non-spec decodes, and at most that many spec rows AND spec tokens; `_stage_decode`: no
prefills, no spec rows, at most that many decodes). A batch with a prefill, or more spec rows or
tokens than that, leaves them as the last staged batch (or the capture) left them, which is what a
FULL graph replayed for it would read. Padding is 0.33.0's: indices with the null block
(the kernels' pad sentinel), masks False, query start locations repeating their last value,
accepted counts 1. `build_for_capture` makes every row a spec row with 1+k accepted tokens, over
the block-table rows it is given (all zero at capture).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..knobs.options import ControlRules, FirstChunk
from .meta import GDNMeta
from .prefix import state_block_columns
from .shape import decode_len


@dataclass
class Common:
    """What the builder reads of one step, host side (vLLM's `CommonAttentionMetadata`, the fields
    GDN uses), one entry a row; rows past the step's requests are padding (query length 0)."""
    query_lens: np.ndarray  # int [rows]
    num_computed: np.ndarray  # int [rows]
    prefilling: np.ndarray  # bool [rows]: still in its prompt (False for padding)
    drafts: np.ndarray  # int [rows]: `num_decode_draft_tokens` (-1: a prefill chunk or padding)
    accepted: np.ndarray  # int [rows]: the row's `num_accepted_tokens` (1 for padding)
    blocks: np.ndarray  # int [rows, width]: the committed block-table rows
    num_actual_tokens: int
    block_size: int | None = None  # prefix caching's block size (None: mode "none", state in column 0)

    def state_blocks(self, k: int) -> np.ndarray:
        """Each row's 1+k state indices (`mamba_get_block_table_tensor`): the first 1+k columns, or
        with a block size the 1+k from the running column (`control.prefix.state_block_columns`)."""
        if self.block_size is None:
            return self.blocks[:, :decode_len(k)]
        return state_block_columns(self.blocks, self.num_computed + self.query_lens, decode_len(k), self.block_size)


def draft_counts(query_lens, drafts, computed, prompts, rules: ControlRules = ControlRules()) -> np.ndarray:
    """`num_decode_draft_tokens` (`GPUModelRunner._prepare_inputs`): a row's draft count where its
    query is exactly its drafts plus one token, else -1 (a prefill chunk); a one-token row past its
    prompt is a spec row with 0 drafts (`ControlRules.zero_draft_spec_row`; vLLM 0.26.0: -1)."""
    q, d = np.asarray(query_lens), np.asarray(drafts)
    out = np.where((d > 0) & (q == d + 1), d, -1)
    if not rules.zero_draft_spec_row:
        return out.astype(np.int32)
    zero_draft = (np.asarray(computed) >= np.asarray(prompts)) & (q == 1)
    return np.where((out < 0) & zero_draft, 0, out).astype(np.int32)


def common_for(batch, blocks: np.ndarray, pad_rows: int = 0, num_actual_tokens: int | None = None,
               accepted: list[int] | None = None, rules: ControlRules = ControlRules()) -> Common:
    """The builder's view of one `StepBatch`, with `pad_rows` zero-length rows after its requests
    (a FULL graph's padded rows); `blocks`: the block-table rows of every row, padding included;
    `accepted`: the requests' accepted counts after the forward copies (`prefix.forward_copies`;
    None: the batch's own); `rules`: the draft bookkeeping's form."""
    pad = [0] * pad_rows
    q = np.asarray(batch.query_lens + pad, dtype=np.int32)
    computed = np.asarray(batch.computed() + pad, dtype=np.int32)
    drafts = draft_counts(batch.query_lens, batch.drafts(), batch.computed(), batch.prompts(), rules)
    return Common(q, computed, np.asarray(batch.is_prefilling() + [False] * pad_rows, dtype=bool),
                  np.concatenate((drafts, np.full(pad_rows, -1, dtype=np.int32))),
                  np.asarray((batch.accepted() if accepted is None else accepted) + [1] * pad_rows, dtype=np.int32),
                  blocks, batch.num_tokens if num_actual_tokens is None else num_actual_tokens, batch.block_size)


def staging_rows(max_num_seqs: int, sizes, spec_tokens: int) -> int:
    """`GDNAttentionMetadataBuilder.decode_cudagraph_max_bs` (`gdn_attn.py: __init__`): the rows of the
    persistent buffers and the limit of both staging branches, on rows and on spec tokens alike:
    `max_num_seqs * (1+k)`, capped by the largest capture size after the spec rounding (`sizes`: the
    runner's, `Dispatcher.sizes`; none: nothing caps it)."""
    rows = max_num_seqs * decode_len(spec_tokens)
    return min(rows, max(sizes)) if len(sizes) else rows


def _qsl(lens) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(lens))).astype(np.int32)


def split_non_spec(common: Common, rule: FirstChunk) -> int:
    """How many leading non-spec rows are decodes (`split_decodes_and_prefills`, the rule's form)."""
    q = common.query_lens
    if rule is FirstChunk.QUERY_LEN:
        if len(q) == 0 or q.max() <= 1:
            return len(q)
        prefill = q > 1
    else:
        no_prior = (q > 0) & (common.num_computed <= 0) & common.prefilling
        prefill = (q > 1) | no_prior
    return int(np.argmax(prefill)) if prefill.any() else len(q)


def decode_rows(common: Common, k: int, rule: FirstChunk) -> np.ndarray:
    """Which rows `build` gives the non-spec decode kernels (bool [rows]): none beside a spec row
    (one-token non-spec rows then go to the prefill kernel, `_spec`), else the leading rows
    `split_non_spec` calls decodes under `rule`. A rule about one-token rows can only act on these."""
    out = np.zeros(len(common.query_lens), dtype=bool)
    if k > 0 and (common.drafts >= 0).any():
        return out
    out[:split_non_spec(common, rule)] = True
    return out


class GDNMetadataBuilder:
    """Builds each step's `GDNMeta` on `device` (module docstring). `spec_tokens`: k; `max_rows`:
    `decode_cudagraph_max_bs` (`staging_rows`); `pad`: what staging writes past the live rows (None:
    nothing, the rows keep what the last staging left)."""

    def __init__(self, spec_tokens: int, max_rows: int, device, full_graphs: bool, pad: int | None,
                 rules: ControlRules = ControlRules()):
        self.k, self.full_graphs, self.pad, self.rules = spec_tokens, full_graphs, pad, rules
        self.device = torch.device(device)
        d, q = max_rows, decode_len(spec_tokens)
        i32 = dict(dtype=torch.int32, device=self.device)
        self.max_rows = d
        # persistent buffers: `torch.empty` in vLLM; zeros here, so a run is a pure function of its seed
        self.spec_state_indices = torch.zeros(d, q, **i32)
        self.non_spec_state_indices = torch.zeros(d, **i32)
        self.spec_query_start_loc = torch.zeros(d + 1, **i32)
        self.non_spec_query_start_loc = torch.zeros(d + 1, **i32)
        self.num_accepted_tokens = torch.ones(d, **i32)
        self.spec_token_indx = torch.zeros(d * q, dtype=torch.long, device=self.device)

    def _t(self, a, dtype=torch.int32) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(a)).to(self.device, dtype)

    def build(self, common: Common) -> GDNMeta:
        spec = (common.drafts >= 0) if self.k > 0 else np.zeros(len(common.query_lens), dtype=bool)
        if not spec.any():
            return self._non_spec(common)
        return self._spec(common, spec)

    def build_for_capture(self, common: Common) -> GDNMeta:
        """`build_for_cudagraph_capture`: every row a spec row that kept all 1+k tokens (k = 0: the
        non-spec path, every row a decode)."""
        q = common.query_lens
        c = Common(q, np.ones_like(q), np.zeros(len(q), dtype=bool), q - 1, q.copy(), common.blocks,
                   common.num_actual_tokens)
        return self.build(c)

    def _non_spec(self, c: Common) -> GDNMeta:
        rows = len(c.query_lens)
        nd = split_non_spec(c, self.rules.first_chunk)
        real = rows  # rows before the zero-length padding rows
        while real and c.query_lens[real - 1] == 0:
            real -= 1
        np_ = max(0, real - nd)  # padding rows after a prefill are not prefills
        idx, qsl = c.state_blocks(0)[:, 0], _qsl(c.query_lens)
        meta = GDNMeta(c.num_actual_tokens, num_decodes=nd, num_prefills=np_,
                       num_decode_tokens=int(c.query_lens[:nd].sum()),
                       num_prefill_tokens=int(c.query_lens[nd:].sum()))
        if self.full_graphs and np_ == 0 and nd <= self.max_rows:  # `_stage_decode`
            self._stage(self.non_spec_state_indices, idx[:real], rows, self.pad)
            self._stage_qsl(self.non_spec_query_start_loc, qsl[:real + 1], rows)
            meta.non_spec_state_indices = self.non_spec_state_indices[:rows]
            meta.non_spec_query_start_loc = self.non_spec_query_start_loc[:rows + 1]
        else:
            meta.non_spec_state_indices, meta.non_spec_query_start_loc = self._t(idx), self._t(qsl)
        meta.has_initial_state = self._t(c.num_computed > 0, torch.bool)
        return meta

    def _spec(self, c: Common, spec: np.ndarray) -> GDNMeta:
        q, rows = c.query_lens, len(c.query_lens)
        ns = int(spec.sum())
        non = ~spec
        nd = int((non & (q == 1)).sum())
        np_ = int((non & (q > 1)).sum())
        if nd and ns:  # beside spec rows, one-token non-spec rows go to the prefill kernel
            np_, nd = np_ + nd, 0
        spec_tokens = int(q[spec].sum())
        meta = GDNMeta(c.num_actual_tokens, num_decodes=nd, num_prefills=np_, num_spec_decodes=ns,
                       num_spec_decode_tokens=spec_tokens,
                       num_prefill_tokens=int(q[non].sum()))
        state = c.state_blocks(self.k)
        spec_idx, accepted = state[spec], c.accepted[spec]
        spec_qsl = _qsl(q[spec])
        if np_ == 0 and nd == 0:
            # the spec rows' tokens in order, `min(num_spec_decodes * (1+k), tokens)` of them (what the XPU
            # kernel is handed; the CUDA kernels do not read it)
            order = np.arange(min(ns * decode_len(self.k), spec_tokens))
            if self.full_graphs and ns <= self.max_rows and spec_tokens <= self.max_rows:  # `_stage_spec_decode`
                self._stage(self.spec_state_indices, spec_idx, rows, self.pad)
                self._stage_qsl(self.spec_query_start_loc, spec_qsl, rows)
                self._stage(self.num_accepted_tokens, accepted, rows, 1)
                self._stage(self.spec_token_indx, order, len(order), None)
                meta.spec_state_indices = self.spec_state_indices[:rows]
                meta.spec_query_start_loc = self.spec_query_start_loc[:rows + 1]
                meta.num_accepted_tokens = self.num_accepted_tokens[:rows]
                meta.spec_token_indx = self.spec_token_indx[:len(order)]
            else:
                meta.spec_state_indices, meta.spec_query_start_loc = self._t(spec_idx), self._t(spec_qsl)
                meta.num_accepted_tokens = self._t(accepted)
                meta.spec_token_indx = self._t(order, torch.long)
            return meta
        token_spec = np.repeat(spec, q)
        order = np.argsort(token_spec, kind="stable")  # the non-spec rows' tokens first, then the spec rows'
        n_non = int((~token_spec).sum())
        meta.non_spec_token_indx = self._t(order[:n_non], torch.long)
        meta.spec_token_indx = self._t(order[n_non:], torch.long)
        meta.spec_state_indices, meta.spec_query_start_loc = self._t(spec_idx), self._t(spec_qsl)
        meta.num_accepted_tokens = self._t(accepted)
        meta.non_spec_state_indices = self._t(state[non][:, 0])
        meta.non_spec_query_start_loc = self._t(_qsl(q[non]))
        meta.has_initial_state = self._t(c.num_computed[non] > 0, torch.bool)
        return meta

    def _stage(self, buf: torch.Tensor, live: np.ndarray, rows: int, pad: int | None) -> None:
        """Rows [:len(live)] from `live`, rows [len(live):rows] padded (`pad` None: left as they are)."""
        n = len(live)
        if n:
            buf[:n].copy_(self._t(live, buf.dtype))
        if rows > n and pad is not None:
            buf[n:rows].fill_(pad)

    def _stage_qsl(self, buf: torch.Tensor, qsl: np.ndarray, rows: int) -> None:
        """Query start locations: the live ones, then the last value repeated (zero-length rows)."""
        live = np.concatenate((qsl, np.full(rows + 1 - len(qsl), qsl[-1], dtype=np.int32)))
        buf[:rows + 1].copy_(self._t(live))
