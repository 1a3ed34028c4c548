"""What vllm-xpu-kernels' fused GDN op (`_xpu_C.gdn_attention`) does with each row, token and state
index: the rules `xpu_semantics.py` carries out, each with the file and function it was read from,
and what the sources leave unknown (the cases it refuses). `docs/real-bugs.md` prints both lists.
"""
from __future__ import annotations

SOURCE = ("vllm-project/vllm-xpu-kernels at 4543b58 (2026-08-19), `csrc/xpu/gdn_attn/`: the newest sources stored. "
          "The 0.1.16.2 wheel the `vllm_xpu` provider loads is later (it also registers "
          "`gated_delta_rule_spec_recoverssm`, absent there); its `gdn_attention`, `causal_conv1d_non_spec` and "
          "`gated_delta_rule_non_spec` schemas are the same strings, its kernel bodies were not read "
          "(compiled only). A later source of that newer op (`gated_delta_rule_recoverssm.hpp`) skips a state index "
          "`<= null_block_id`: where the wheel's other kernels gained such a check, these rules are older than the "
          "B70's")

# (rule, where it was read). Files are under csrc/xpu/gdn_attn/.
RULES = (
    ("Groups: the spec group runs when num_spec_decodes > 0, then the non-spec group when num_prefills + "
     "num_decodes > 0 and it has tokens; each is a conv launch, then a recurrence launch.",
     "gdn_attn_interface.cpp: gdn_attention"),
    ("Bounds: every buffer is narrowed to its first num_actual_tokens rows; the non-spec conv runs "
     "non_spec_token_indx.size(0) tokens, or num_actual_tokens without it; the index tensors' sizes are checked "
     "against the counts.",
     "gdn_attn_interface.cpp: causal_conv1d_non_spec, causal_conv1d_spec, gated_delta_rule_non_spec"),
    ("The pad sentinel is -1 and only the conv kernels skip it (pad_slot_id = -1, fixed); no kernel checks for 0, "
     "so vLLM's null block 0 is read and written like any block; the recurrence kernels check no index at all.",
     "gdn_attn_interface.cpp (pad_slot_id); causal_conv1d.hpp: causal_conv1d_kernel, causal_conv1d_spec_kernel; "
     "gated_delta_rule.hpp: gated_delta_rule_kernel, gated_delta_rule_spec_kernel; "
     "xe_2/chunk_gated_delta_rule_kernels_xe2.hpp"),
    ("Non-spec conv: token t belongs to the first row whose query end is past it; a token past every row's end "
     "belongs to the last row, as if that row started at token 0. A row of at most one token (and such a stray "
     "token) writes its window into its block in place; a longer row's last window is written after the launch, "
     "for every row whose length is not 1, unchecked, and only when the batch has prefills.",
     "causal_conv1d.hpp: causal_conv1d_kernel, update_states_kernel, kernel_launcher"),
    ("With prefills the non-spec group runs the XE2 kernels (the wheel is built with them): the conv as above, but "
     "from 8 tokens on the tiled kernel, which drops stray tokens; the recurrence over every row in chunks of 64, "
     "touching no state for a row without tokens, writing a chunk's outputs from its first token's position on.",
     "gdn_attn_interface.cpp: causal_conv1d_non_spec, gated_delta_rule_non_spec (VLLM_XPU_ENABLE_XE2); "
     "xe_2/chunk_causal_conv1d_xe2.hpp, xe_2/chunk_causal_conv1d_tiled_xe2.hpp, "
     "xe_2/chunk_gated_delta_rule_kernels_xe2.hpp: chunk_gated_delta_rule_impl_xe2"),
    ("Without prefills the recurrence runs rows 0..num_decodes-1 (not the query start locations' rows): each loads "
     "its block (zeros where has_initial_state is given and false), steps its tokens and writes the block back, "
     "tokens or not.",
     "gated_delta_rule.hpp: gated_delta_rule (batch_size = num_decodes), gated_delta_rule_kernel"),
    ("Spec rows are exactly 1+k tokens each, token t of row b at spec_token_indx[b*(1+k) + t], whatever the query "
     "start locations say (the count is checked); conv and state start from the block of column "
     "max(num_accepted - 1, 0) and the window and the state after token t go to the block of column t, every column "
     "(the conv window per column block, not at an offset in column 0's block as vLLM's CUDA causal_conv1d_update "
     "keeps it); a column of -1 starts the conv from zeros and is not saved by it.",
     "causal_conv1d.hpp: causal_conv1d_spec_kernel; gated_delta_rule.hpp: gated_delta_rule_spec_kernel; "
     "gdn_attn_interface.cpp: causal_conv1d_spec"),
    ("reorder_input selects the input layout, not the work: True reads projected_states_qkvz as [q | k | v | z] "
     "head-major blocks and projected_states_ba as [b | a] (Qwen3.5/3.6, this suite's layout); False, Qwen3-Next's "
     "per-key-head interleaving. The vllm_xpu adapter passes True.",
     "causal_conv1d.hpp: causal_conv1d_kernel, causal_conv1d_spec_kernel (the ReorderInput offsets)"),
    ("vLLM hands the kernel has_initial_state only when the batch has prefills, and spec_token_indx always "
     "(arange(min(num_spec_decodes * (1+k), tokens)) without non-spec rows).",
     "vllm 0.33.0: v1/attention/backends/gdn_attn.py: GDNAttentionMetadataBuilder.build; _xpu_ops.py: "
     "_gdn_attention_core_xpu_impl"),
)

# What the sources leave unknown: `xpu_semantics` refuses the call in one line (`KernelRefused`).
UNKNOWN = (
    "an index below -1 or past the cache (the kernels address it unchecked: out of bounds)",
    "-1 reaching a recurrence, as a row's index or any spec column (it reads and writes ssm_state[-1]: out of bounds)",
    "a token position outside the inputs",
    "a zero-length row, or a row of -1, in a launch with prefills (the state update writes a buffer the conv launch "
    "never filled for it, unchecked)",
    "prefills without has_initial_state (the XE2 recurrence reads it through a null pointer)",
    "two work-items of one launch writing one block with different bytes, or one reading a block another changes "
    "(the device's order decides), except on the null block (sentinel 0), which no request owns: there the last in "
    "row and token order is taken",
)

# Not modelled: the arithmetic is the `reference` providers' (the SYCL kernels reduce in sub-group order, so bits
# differ on a device); no conv bias (the model has none); reorder_input False.
