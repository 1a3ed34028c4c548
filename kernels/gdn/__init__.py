"""GDN (gated delta net) ops: `repro::gdn_gating`, `repro::gated_delta_rule_decode`,
`repro::gated_delta_rule_prefill`, `repro::gated_delta_rule_spec` (decode with k draft tokens a row).

Per value head h (key head h // (Hv // Hk)), fp32:
    q = q * rsqrt(sum q^2 + 1e-6) * dk^-0.5,   k = k * rsqrt(sum k^2 + 1e-6)
    S = S * exp(g);  delta = beta * (v - k @ S);  S = S + outer(k, delta);  o = q @ S
`ssm_state` [S, Hv, dk, dv] fp32, one row per sequence; addressing, sentinel and duplicate rules in
`kernels/_state.py`. Outputs in v's dtype, zero for sentinel rows / tokens outside every request.

Providers: gating `reference`, `triton`; decode `reference` (row loop), `torch` (batched), `fla`,
`triton` (`triton.py`); prefill `reference` (chunked WY form), `fla`, `triton` (recurrent); spec
`reference` (row and token loop), `torch` (one token position of every row at a time), `triton`,
and `fla` listed absent: fla-core 0.6.0's `fused_recurrent_gated_delta_rule` has no per-token state
indices or accepted counts (vLLM's copy of it adds `ssm_state_indices` and `num_accepted_tokens`),
and it takes unknown keywords silently (`**kwargs`), so they cannot be passed to it. The pieces have
no `vllm_xpu` provider: vllm-xpu-kernels 0.1.16.2's delta stages (`gated_delta_rule_spec`,
`gated_delta_rule_non_spec`) take the raw a and b and gate them themselves, and with prefills its
conv stage hands them q and k already L2-normalised, so no stage is one of these pieces; the whole
core is (`gdn_attention` below).
`naive.py` is an independent token-by-token recurrence used by the tests.

`repro::gdn_attention` is the layer's whole core in one call (conv, gating, recurrence; vLLM's
metadata in, `core_out` and both states written), with vLLM-XPU's fused kernel as the model:
providers `reference` (`core.py`: the pieces above composed as vLLM's CUDA `_forward_core` calls
them, every piece skipping the sentinel it is given), `xpu_semantics` (`xpu_semantics.py`: what
vllm-xpu-kernels' `_xpu_C.gdn_attention` does with each row and index, read from its sources, on
any device) and `vllm_xpu` (`vllm_xpu.py`: the kernel itself). The island runs the pieces itself
unless a fused provider is selected (`fused`), so a capture sees each piece as its own op.
"""
from __future__ import annotations

import torch

from kernels import registry
from kernels._library import define
from typing import Optional

from kernels.availability import triton, vllm_xpu
from kernels.gdn.common import check_gdn
from kernels.gdn.fla import available as fla_available
from kernels.registry import Source

__all__ = ["gdn_gating", "gated_delta_rule_decode", "gated_delta_rule_prefill", "gated_delta_rule_spec",
           "gdn_attention", "fused"]

# FLA's decode, called by keyword, is batch-invariant: rows at B=1..7 equal the same rows inside a
# padded batch of 8 bit for bit (docs/fla/REPORT.md, H200, fla-core 0.6.0; a positional call would
# put beta into `gk` and read past its end, which looks like nondeterminism). Its chunked prefill was
# not measured that way and runs bf16 intermediates chosen per launch: declared batch-variant.
registry.declare(__name__, "gdn", {
    "gated_delta_rule_decode": {
        "fla": Source(".fla:gated_delta_rule_decode_fla", fla_available),
        "reference": Source(".reference:gated_delta_rule_decode_reference"),
        "torch": Source(".vectorized:gated_delta_rule_decode_vectorized"),
        "triton": Source(".triton:gated_delta_rule_decode", triton),
    },
    "gated_delta_rule_prefill": {
        "fla": Source(".fla:gated_delta_rule_prefill_fla", fla_available, batch_invariant=False),
        "reference": Source(".reference:gated_delta_rule_prefill_reference"),
        "triton": Source(".triton:gated_delta_rule_prefill", triton),
    },
    "gdn_gating": {
        "reference": Source(".reference:gdn_gating_reference"),
        "triton": Source(".triton:gdn_gating", triton),
    },
    "gated_delta_rule_spec": {
        "reference": Source(".reference:gated_delta_rule_spec_reference"),
        "torch": Source(".vectorized:gated_delta_rule_spec_vectorized"),
        "triton": Source(".triton:gated_delta_rule_spec", triton),
        "fla": Source(None, lambda: (False, "fla-core 0.6.0's fused_recurrent_gated_delta_rule takes no "
                                            "ssm_state_indices / num_accepted_tokens (vLLM's copy of it does)")),
    },
    # Each fused provider's own reference (the third copy's) is `xpu_semantics`: the plain-torch
    # statement of the kernel's rules. The kernel's work split depends on the batch (a prefill sends
    # every non-spec row through the XE2 chunk kernel, a decode-only launch through the recurrent one),
    # and its statement follows it (chunked or step by step): both declared batch-variant. Padding a
    # decode-only launch changes neither.
    "gdn_attention": {
        "reference": Source(".core:gdn_attention_reference"),
        "xpu_semantics": Source(".xpu_semantics:gdn_attention_xpu_semantics", batch_invariant=False,
                                reference="xpu_semantics"),
        "vllm_xpu": Source(".vllm_xpu:gdn_attention_vllm_xpu", vllm_xpu, batch_invariant=False,
                           reference="xpu_semantics"),
    },
})


def fused() -> bool:
    """Whether the GDN core runs as one `repro::gdn_attention` call: a provider other than the
    composition (`reference`) is selected for it. Under the composition the island calls each piece
    itself (`core.composed`), so captures, the lint and the hazards see them as the ops they are."""
    return registry.selected("gdn_attention") != "reference"


@define("gdn_gating", mutates_args=())
def gdn_gating(A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor,
               b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A_log, dt_bias [Hv]; a, b [T, Hv] -> g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b); fp32."""
    if a.shape != b.shape or a.shape[-1] != A_log.numel() or dt_bias.numel() != A_log.numel():
        raise ValueError(f"gdn_gating: A_log {tuple(A_log.shape)}, a {tuple(a.shape)}, "
                         f"dt_bias {tuple(dt_bias.shape)}, b {tuple(b.shape)}")
    g, beta = registry.impl("gdn_gating")(A_log, a, dt_bias, b)
    return g.contiguous(), beta.contiguous()


@gdn_gating.register_fake
def _(A_log, a, dt_bias, b):
    return (torch.empty(a.shape, dtype=torch.float32, device=a.device),
            torch.empty(a.shape, dtype=torch.float32, device=a.device))


@define("gated_delta_rule_decode", mutates_args=("ssm_state",))
def gated_delta_rule_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                            beta: torch.Tensor, ssm_state: torch.Tensor, state_indices: torch.Tensor,
                            sentinel: int) -> torch.Tensor:
    """One step for B rows: q, k [B, Hk, dk], v [B, Hv, dv], g, beta [B, Hv] -> o [B, Hv, dv].
    Graph-safe (no host sync)."""
    check_gdn(q, k, v, g, beta, ssm_state)
    return registry.impl("gated_delta_rule_decode")(q, k, v, g, beta, ssm_state, state_indices, sentinel)


@gated_delta_rule_decode.register_fake
def _(q, k, v, g, beta, ssm_state, state_indices, sentinel):
    return torch.empty(v.shape, dtype=v.dtype, device=v.device)


@define("gated_delta_rule_prefill", mutates_args=("ssm_state",))
def gated_delta_rule_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                             beta: torch.Tensor, ssm_state: torch.Tensor, query_start_loc: torch.Tensor,
                             state_indices: torch.Tensor, has_initial_state: torch.Tensor,
                             sentinel: int) -> torch.Tensor:
    """Varlen prefill: q, k [T, Hk, dk], v [T, Hv, dv], g, beta [T, Hv]; request b owns tokens
    query_start_loc[b]:query_start_loc[b+1], starts from ssm_state[state_indices[b]] where
    has_initial_state[b] (else zeros) and writes its final state back. Syncs with the host."""
    check_gdn(q, k, v, g, beta, ssm_state)
    return registry.impl("gated_delta_rule_prefill")(q, k, v, g, beta, ssm_state, query_start_loc,
                                                     state_indices, has_initial_state, sentinel)


@gated_delta_rule_prefill.register_fake
def _(q, k, v, g, beta, ssm_state, query_start_loc, state_indices, has_initial_state, sentinel):
    return torch.empty(v.shape, dtype=v.dtype, device=v.device)


@define("gated_delta_rule_spec", mutates_args=("ssm_state",))
def gated_delta_rule_spec(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                          ssm_state: torch.Tensor, state_indices: torch.Tensor, num_accepted: torch.Tensor,
                          query_start_loc: torch.Tensor, sentinel: int) -> torch.Tensor:
    """Speculative decode: q, k [T, Hk, dk], v [T, Hv, dv], g, beta [T, Hv] -> o [T, Hv, dv];
    state_indices [B, 1+k]; row b owns tokens query_start_loc[b]:query_start_loc[b+1] (at most
    1+k; zero-length rows are padding), starts from ssm_state[state_indices[b, num_accepted[b]-1]]
    as it was before the call, takes one decode step a token, and stores the state after token t
    into ssm_state[state_indices[b, t]] unless that is the sentinel (several on one slot: the last
    (row, token) wins). Rows whose source is the sentinel, padding rows and tokens outside every
    row give zero outputs and write nothing. Graph-safe (no host sync)."""
    check_gdn(q, k, v, g, beta, ssm_state)
    B = state_indices.shape[0]
    if state_indices.dim() != 2 or state_indices.shape[1] < 1 or num_accepted.shape != (B,) or \
            query_start_loc.shape != (B + 1,):
        raise ValueError(f"gated_delta_rule_spec: state_indices {tuple(state_indices.shape)}, num_accepted "
                         f"{tuple(num_accepted.shape)}, query_start_loc {tuple(query_start_loc.shape)}: "
                         "need [B, 1+k], [B], [B+1]")
    return registry.impl("gated_delta_rule_spec")(q, k, v, g, beta, ssm_state, state_indices, num_accepted,
                                                  query_start_loc, sentinel)


@gated_delta_rule_spec.register_fake
def _(q, k, v, g, beta, ssm_state, state_indices, num_accepted, query_start_loc, sentinel):
    return torch.empty(v.shape, dtype=v.dtype, device=v.device)


@define("gdn_attention", mutates_args=("core_out", "conv_state", "ssm_state"))
def gdn_attention(core_out: torch.Tensor, qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                  conv_weight: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, conv_state: torch.Tensor,
                  ssm_state: torch.Tensor, num_prefills: int, num_decodes: int, num_spec_decodes: int,
                  num_actual_tokens: int, num_decode_tokens: int, num_prefill_tokens: int,
                  has_initial_state: Optional[torch.Tensor], non_spec_query_start_loc: Optional[torch.Tensor],
                  non_spec_token_indx: Optional[torch.Tensor], non_spec_state_indices: Optional[torch.Tensor],
                  spec_query_start_loc: Optional[torch.Tensor], spec_token_indx: Optional[torch.Tensor],
                  spec_state_indices: Optional[torch.Tensor], num_accepted_tokens: Optional[torch.Tensor],
                  sentinel: int) -> None:
    """The GDN core of one step (vLLM's `GDNAttentionMetadata` fields, `control/meta.py`): qkv [T', C]
    (conv input, [q | k | v] head-major), b, a [T', Hv], conv_weight [C, K], A_log, dt_bias [Hv],
    conv_state [S, C, K-1+k], ssm_state [S, Hv, dk, dv]; writes core_out [T', Hv, dv] (first
    `num_actual_tokens` rows) and both states in place. Token and row index tensors as vLLM builds
    them (int32 indices, int64 token maps; a mixed batch's spec and non-spec tokens by index).
    What each provider does with a padded, null or stale row is that provider's (module docstring)."""
    if qkv.dim() != 2 or b.shape != a.shape or b.shape[0] != qkv.shape[0] or ssm_state.dim() != 4 or \
            conv_state.dim() != 3 or conv_state.shape[1] != qkv.shape[1] or core_out.shape[1:] != (
                ssm_state.shape[1], ssm_state.shape[3]):
        raise ValueError(f"gdn_attention: qkv {tuple(qkv.shape)}, b {tuple(b.shape)}, a {tuple(a.shape)}, core_out "
                         f"{tuple(core_out.shape)}, conv_state {tuple(conv_state.shape)}, ssm_state "
                         f"{tuple(ssm_state.shape)}")
    registry.impl("gdn_attention")(core_out, qkv, b, a, conv_weight, A_log, dt_bias, conv_state, ssm_state,
                                   num_prefills, num_decodes, num_spec_decodes, num_actual_tokens, num_decode_tokens,
                                   num_prefill_tokens, has_initial_state, non_spec_query_start_loc,
                                   non_spec_token_indx, non_spec_state_indices, spec_query_start_loc, spec_token_indx,
                                   spec_state_indices, num_accepted_tokens, sentinel)


@gdn_attention.register_fake
def _(*args):
    return None
