"""vLLM's GDN metadata builder (`vllm/v1/attention/backends/gdn_attn.py: GDNAttentionMetadataBuilder`)
behind the mirror's calls (`repro.control.builder.GDNMetadataBuilder`: `build(common)`,
`build_for_capture(common)`, its persistent buffers).

The mirror's `Common` (one step as the builder reads it) becomes vLLM's `CommonAttentionMetadata` as
`GPUModelRunner._build_attention_metadata` fills it: query start locations over every row (padding
rows of length 0), sequence lengths computed plus scheduled (the optimistic ones, also the upper
bound), the committed block-table rows, `is_prefilling` (False for padding), and with K > 0 the
accepted counts and `num_decode_draft_tokens` as the runner passes them. vLLM allocates its
persistent buffers with `torch.empty`; the seam fills them with `POISON` once, after construction, so
a comparison can tell a row vLLM wrote from one it never did (`written`).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .config import mamba_spec

POISON = -7777  # what an unwritten row of vLLM's persistent buffers holds here (masks: True)
# vLLM's persistent buffers and the mirror's attribute for each (None: the mirror keeps none)
BUFFERS = {
    "spec_state_indices_tensor": "spec_state_indices",
    "non_spec_state_indices_tensor": "non_spec_state_indices",
    "spec_query_start_loc": "spec_query_start_loc",
    "non_spec_query_start_loc": "non_spec_query_start_loc",
    "num_accepted_tokens": "num_accepted_tokens",
    "spec_sequence_masks": None,
    "spec_token_indx": None,
    "non_spec_token_indx": None,
}
# The metadata's fields the mirror's `GDNMeta` has, by vLLM's name -> the mirror's.
FIELDS = {
    "num_actual_tokens": "num_actual_tokens", "num_decodes": "num_decodes", "num_prefills": "num_prefills",
    "num_spec_decodes": "num_spec_decodes", "num_decode_tokens": "num_decode_tokens",
    "num_prefill_tokens": "num_prefill_tokens", "num_spec_decode_tokens": "num_spec_decode_tokens",
    "non_spec_query_start_loc": "non_spec_query_start_loc",
    "non_spec_state_indices_tensor": "non_spec_state_indices", "has_initial_state": "has_initial_state",
    "spec_query_start_loc": "spec_query_start_loc", "spec_state_indices_tensor": "spec_state_indices",
    "num_accepted_tokens": "num_accepted_tokens", "spec_token_indx": "spec_token_indx",
    "non_spec_token_indx": "non_spec_token_indx",
}


class Builder:
    """One `GDNAttentionMetadataBuilder` of the GDN layers under `cfg` (module docstring), its
    persistent buffers on `device`."""

    def __init__(self, up, cfg, device="cpu"):
        self.up, self.cfg = up, cfg
        self.spec = mamba_spec(up, cfg)
        self.k = cfg.num_speculative_tokens
        with up.config.set_current_vllm_config(cfg):
            self.builder = up.gdn_attn.GDNAttentionMetadataBuilder(self.spec, ["gdn"], cfg, torch.device(device))
        for name in BUFFERS:
            buf = getattr(self.builder, name)
            buf.fill_(True if buf.dtype == torch.bool else POISON)

    @property
    def max_rows(self) -> int:
        """`decode_cudagraph_max_bs`: the rows (and tokens) the persistent buffers hold."""
        return self.builder.decode_cudagraph_max_bs

    def common(self, c, capture: bool = False):
        """vLLM's `CommonAttentionMetadata` for the mirror's `Common` `c` (module docstring). At
        capture (and a FULL dummy run) `_dummy_run` sets each row's sequence length to its query
        length, and no row is in its prompt (the rows a capture reads hold no request): the
        mirror's `build_for_capture` ignores `c.num_computed` and `c.prefilling` alike."""
        q = np.asarray(c.query_lens, dtype=np.int32)
        qsl = torch.from_numpy(np.concatenate(([0], np.cumsum(q))).astype(np.int32))
        computed = np.zeros_like(q) if capture else np.asarray(c.num_computed)
        seq = torch.from_numpy((computed + q).astype(np.int32))
        fields = dict(query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq, num_reqs=len(q),
                      num_actual_tokens=int(c.num_actual_tokens), max_query_len=int(q.max(initial=0)),
                      max_seq_len=int(seq.max().item()) if len(q) else 0,
                      block_table_tensor=torch.from_numpy(np.ascontiguousarray(c.blocks, dtype=np.int32)),
                      slot_mapping=torch.zeros(int(c.num_actual_tokens), dtype=torch.int64),
                      is_prefilling=torch.from_numpy(np.asarray(c.prefilling, dtype=bool) & (not capture)),
                      seq_lens_cpu_upper_bound=seq.clone())
        cls = self.up.backend.CommonAttentionMetadata
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in fields.items() if k in names})

    def _spec_args(self, c) -> dict:
        if not self.k:  # the runner passes these only with a speculative config
            return {}
        return {"num_accepted_tokens": torch.from_numpy(np.asarray(c.accepted, dtype=np.int32)),
                "num_decode_draft_tokens_cpu": torch.from_numpy(np.asarray(c.drafts, dtype=np.int32))}

    def build(self, c):
        """`build(0, common, ...)` as `_build_attention_metadata` calls it."""
        return self.builder.build(0, self.common(c), **self._spec_args(c))

    def build_for_capture(self, c):
        """`build_for_cudagraph_capture(common)`."""
        return self.builder.build_for_cudagraph_capture(self.common(c, capture=True))

    def buffers(self) -> dict[str, torch.Tensor]:
        """Every persistent buffer, by vLLM's name (views: clone to keep)."""
        return {name: getattr(self.builder, name) for name in BUFFERS}

    def staged(self, meta) -> dict[str, bool]:
        """For each field of `meta` that is a tensor: whether it is a view of a persistent buffer
        (what a FULL graph captured over it reads), by vLLM's field name."""
        out = {}
        for name in BUFFERS:
            t = getattr(meta, name, None)
            if isinstance(t, torch.Tensor):
                buf = getattr(self.builder, name)
                out[name] = t.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
        return out


def fields(meta) -> dict:
    """The metadata's fields the mirror also has (`FIELDS`), by the mirror's name: ints as ints,
    tensors as lists, None as None."""
    out = {}
    for theirs, ours in FIELDS.items():
        v = getattr(meta, theirs, None)
        out[ours] = v.tolist() if isinstance(v, torch.Tensor) else v
    return out
