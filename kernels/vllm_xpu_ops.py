"""The vllm-xpu-kernels ops the `vllm_xpu` providers call: their schemas (data) and where the
adapters find them (when they load: `kernels/availability.py`).

Schemas: read from the shared objects of the vllm-xpu-kernels 0.1.16.2 wheel (PyPI), exactly as
registered there (`SCHEMAS`, keyed `library::name`). They are kept here so that a CPU test
(`tests/test_xpu_contract.py`) can register them under a test namespace, with CPU bodies that
check dtypes and shapes as the real kernels do, and drive our adapters through them: a wheel or
adapter change that breaks a call then fails in CI without an Intel GPU. A new wheel: update
`WHEEL_VERSION` and the strings, and the contract test says which adapter no longer fits.

Namespaces: the adapters take the op namespace as a keyword argument (`ns=`), defaulting to the
real one (`torch.ops._C`, `torch.ops._moe_C`, `torch.ops._xpu_C`); the contract test passes its own.
"""
from __future__ import annotations

import torch

from kernels import registry

WHEEL = "vllm-xpu-kernels"
WHEEL_VERSION = "0.1.16.2"
EXTENSIONS = ("vllm_xpu_kernels._C", "vllm_xpu_kernels._moe_C", "vllm_xpu_kernels._xpu_C")
for _library in ("_C", "_moe_C", "_xpu_C"):  # a kernel report's script imports these before it finds the op
    registry.op_library(_library, f"vllm_xpu_kernels.{_library}")

# library -> {op name: schema}, as registered by the 0.1.16.2 wheel (only the ops we call).
SCHEMAS = {
    "_C": {
        "gemma_rms_norm": "gemma_rms_norm(Tensor! result, Tensor! input, Tensor! weight, float epsilon) -> ()",
    },
    "_moe_C": {
        "topk_softmax": "topk_softmax(Tensor! topk_weights, Tensor! topk_indices, Tensor! token_expert_indices, "
                        "Tensor gating_output, bool renormalize, Tensor? bias, Tensor? is_padding) -> ()",
    },
    "_xpu_C": {
        "gdn_attention": "gdn_attention(Tensor! core_attn_out, Tensor! z, Tensor projected_states_qkvz, "
                         "Tensor projected_states_ba,int num_k_heads, int num_v_heads, int head_k_dim, "
                         "int head_v_dim,Tensor! conv_state, Tensor! ssm_state, Tensor conv_weights, "
                         "Tensor? conv_bias, str activation, Tensor A_log, Tensor dt_bias,int num_prefills, "
                         "int num_decodes, int num_spec_decodes, Tensor? has_initial_state, "
                         "Tensor? non_spec_query_start_loc,  Tensor? non_spec_token_indx,"
                         "Tensor? non_spec_state_indices_tensor, Tensor? spec_query_start_loc, "
                         "Tensor? spec_token_indx, Tensor? spec_state_indices_tensor, Tensor? num_accepted_tokens, "
                         "int num_actual_tokens, int tp_size, bool reorder_input) -> ()",
    },
}


def namespace(library: str):
    """The real op namespace of a wheel library (`"_C"` -> `torch.ops._C`)."""
    if library not in SCHEMAS:
        raise KeyError(f"no vllm-xpu-kernels library {library!r} is called here; known: {', '.join(SCHEMAS)}")
    return getattr(torch.ops, library)
