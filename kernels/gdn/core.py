"""The GDN layer's core as one call, composed of the per-piece ops (`reference` of `repro::gdn_attention`).

This is vLLM's `_forward_core` (`vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py`) on
the CUDA path: spec rows through the spec conv update and recurrence (state read from column
accepted-1, the state after token t written to column t), non-spec decodes through the one-token
update, prefills through the varlen kernels; in a mixed batch each part's tokens are gathered by
index and its outputs scattered back. Each piece is a `repro::` op, so the providers selected for
the pieces run here, and every piece skips the sentinel it is given.

The island (`repro/islands/gdn.py`) calls `composed` itself, so a capture, the lint and the hazards
see each piece as its own op; `repro::gdn_attention` runs it as one op only when a caller asks for
the whole core (a test, or a fused provider's comparison).
"""
from __future__ import annotations

import torch

from kernels._library import namespace as ops


def head_dims(qkv: torch.Tensor, ssm_state: torch.Tensor) -> tuple[int, int, int, int]:
    """(Hk, dk, Hv, dv) of a layer from its conv input [T, 2*Hk*dk + Hv*dv] and state [S, Hv, dk, dv]."""
    Hv, dk, dv = ssm_state.shape[1:]
    return (qkv.shape[1] - Hv * dv) // (2 * dk), dk, Hv, dv


def split_qkv(y: torch.Tensor, Hk: int, dk: int, Hv: int, dv: int):
    """[T, 2*Hk*dk + Hv*dv] -> q, k [T, Hk, dk], v [T, Hv, dv] (`in_proj_qkv`'s [q | k | v], head-major)."""
    t, kd = y.shape[0], Hk * dk
    return y[:, :kd].reshape(t, Hk, dk), y[:, kd:2 * kd].reshape(t, Hk, dk), y[:, 2 * kd:].reshape(t, Hv, dv)


def composed(core_out, qkv, b, a, conv_weight, A_log, dt_bias, conv_state, ssm_state, num_prefills: int,
             num_decodes: int, num_spec_decodes: int, num_actual_tokens: int, num_decode_tokens: int,
             num_prefill_tokens: int, has_initial_state, non_spec_query_start_loc, non_spec_token_indx,
             non_spec_state_indices, spec_query_start_loc, spec_token_indx, spec_state_indices, num_accepted_tokens,
             sentinel: int, decode_rule=None) -> None:
    """Write the core's output into `core_out` and the states in place (module docstring). `decode_rule`:
    the op the non-spec decodes' recurrence calls (default `repro::gated_delta_rule_decode`; a hazard
    passes one with another schema)."""
    dims = head_dims(qkv, ssm_state)
    n = num_actual_tokens
    mixed = num_spec_decodes > 0 and num_decodes + num_prefills > 0
    if num_spec_decodes:
        def spec(x, bb, aa):
            idx, acc, qsl = spec_state_indices, num_accepted_tokens, spec_query_start_loc
            y = ops.causal_conv1d_update_spec(x, conv_weight, conv_state, idx[:, 0].contiguous(), acc, qsl, sentinel)
            q, k, v = split_qkv(y, *dims)
            g, beta = ops.gdn_gating(A_log, aa, dt_bias, bb)
            return ops.gated_delta_rule_spec(q, k, v, g, beta, ssm_state, idx, acc, qsl, sentinel)
        if mixed:
            idx = spec_token_indx
            core_out.index_copy_(0, idx, spec(qkv.index_select(0, idx), b.index_select(0, idx), a.index_select(0, idx)))
        else:
            core_out[:n].copy_(spec(qkv[:n], b[:n], a[:n]))
    if num_decodes or num_prefills:
        def non_spec(x, bb, aa, out):
            """Decodes (the first `num_decodes` rows, one token each), then prefills, into `out`."""
            nd = num_decodes
            if nd:
                idx = non_spec_state_indices[:nd]
                y = ops.causal_conv1d_update(x[:nd], conv_weight, conv_state, idx, sentinel)
                q, k, v = split_qkv(y, *dims)
                g, beta = ops.gdn_gating(A_log, aa[:nd], dt_bias, bb[:nd])
                rule = ops.gated_delta_rule_decode if decode_rule is None else decode_rule
                out[:nd].copy_(rule(q, k, v, g, beta, ssm_state, idx, sentinel))
            if num_prefills:
                d0, end = num_decode_tokens, num_decode_tokens + num_prefill_tokens
                qsl = non_spec_query_start_loc[nd:] - d0
                idx, init = non_spec_state_indices[nd:], has_initial_state[nd:]
                y = ops.causal_conv1d_fn(x[d0:end], conv_weight, conv_state, qsl, idx, init, sentinel)
                q, k, v = split_qkv(y, *dims)
                g, beta = ops.gdn_gating(A_log, aa[d0:end], dt_bias, bb[d0:end])
                out[d0:end].copy_(ops.gated_delta_rule_prefill(q, k, v, g, beta, ssm_state, qsl, idx, init, sentinel))
            return out
        if mixed:
            idx = non_spec_token_indx
            scratch = torch.empty(idx.shape[0], *core_out.shape[1:], dtype=core_out.dtype, device=core_out.device)
            core_out.index_copy_(0, idx, non_spec(qkv.index_select(0, idx), b.index_select(0, idx),
                                                  a.index_select(0, idx), scratch))
        else:
            non_spec(qkv[:n], b[:n], a[:n], core_out[:n])


def gdn_attention_reference(core_out, qkv, b, a, conv_weight, A_log, dt_bias, conv_state, ssm_state, num_prefills,
                            num_decodes, num_spec_decodes, num_actual_tokens, num_decode_tokens, num_prefill_tokens,
                            has_initial_state, non_spec_query_start_loc, non_spec_token_indx, non_spec_state_indices,
                            spec_query_start_loc, spec_token_indx, spec_state_indices, num_accepted_tokens,
                            sentinel) -> None:
    composed(core_out, qkv, b, a, conv_weight, A_log, dt_bias, conv_state, ssm_state, num_prefills, num_decodes,
             num_spec_decodes, num_actual_tokens, num_decode_tokens, num_prefill_tokens, has_initial_state,
             non_spec_query_start_loc, non_spec_token_indx, non_spec_state_indices, spec_query_start_loc,
             spec_token_indx, spec_state_indices, num_accepted_tokens, sentinel)
