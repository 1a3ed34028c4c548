"""Every `repro::` op as a Python callable (same objects as `torch.ops.repro.<name>` dispatches to),
plus the Python helpers. `kernels.ops.w8a8_linear(x, w, s)` == `torch.ops.repro.w8a8_linear(x, w, s)`."""
from kernels.conv1d import causal_conv1d_fn, causal_conv1d_update, causal_conv1d_update_spec
from kernels.gdn import (gated_delta_rule_decode, gated_delta_rule_prefill, gated_delta_rule_spec, gdn_attention,
                         gdn_gating)
from kernels.moe import moe, moe_block
from kernels.norms import add_rms_norm, rms_norm, rms_norm_gated
from kernels.w8a8_linear import linear, quantize_per_token, quantize_with_scale, w8a8_linear

OPS = ("w8a8_linear", "rms_norm", "add_rms_norm", "rms_norm_gated", "causal_conv1d_fn", "causal_conv1d_update",
       "causal_conv1d_update_spec", "gdn_gating", "gated_delta_rule_decode", "gated_delta_rule_prefill",
       "gated_delta_rule_spec", "gdn_attention", "moe")
GRAPH_SAFE = ("w8a8_linear", "rms_norm", "add_rms_norm", "rms_norm_gated", "causal_conv1d_update",
              "causal_conv1d_update_spec", "gdn_gating", "gated_delta_rule_decode", "gated_delta_rule_spec", "moe")

__all__ = ["w8a8_linear", "rms_norm", "add_rms_norm", "rms_norm_gated", "causal_conv1d_fn", "causal_conv1d_update",
           "causal_conv1d_update_spec", "gdn_gating", "gated_delta_rule_decode", "gated_delta_rule_prefill",
           "gated_delta_rule_spec", "gdn_attention", "moe", "linear", "quantize_per_token",
           "quantize_with_scale", "moe_block", "OPS", "GRAPH_SAFE"]
