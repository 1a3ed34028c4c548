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
and it takes unknown keywords silently (`**kwargs`), so they cannot be passed to it. No `vllm_xpu`:
vllm-xpu-kernels 0.1.16.2 runs the speculative recurrence only inside `gdn_attention`, fused with
the conv and the gating.
`naive.py` is an independent token-by-token recurrence used by the tests.
"""
from __future__ import annotations

import torch

from kernels import registry
from kernels._library import define
from kernels.availability import triton
from kernels.gdn.common import check_gdn
from kernels.gdn.fla import available as fla_available
from kernels.registry import Source

__all__ = ["gdn_gating", "gated_delta_rule_decode", "gated_delta_rule_prefill", "gated_delta_rule_spec"]

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
})


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
