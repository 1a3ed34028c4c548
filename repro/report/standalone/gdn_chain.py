#!/usr/bin/env python3
"""@TITLE@

A standalone reproducer written by `repro report`. It needs @NEEDS@ (and
intel_extension_for_pytorch on an IPEX XPU stack only); it does not import the suite that
generated it.

It rebuilds one Qwen3.6-35B-A3B (W8A8 INT8) GDN layer as vLLM's PIECEWISE split cuts it:

    submod0   embedding -> Gemma RMSNorm (x * (1 + w)) -> W8A8 in_proj_qkv / z / b / a
              (int8 weights, per-channel scales, dynamic per-token int8 activations)
    gdn_core  causal depthwise conv1d (kernel K, SiLU) with a per-slot conv_state ->
              g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b) -> gated delta rule
              with a per-slot fp32 ssm_state (q, k L2-normalised, q * dk^-0.5); rows whose
              state index equals the kernel's sentinel are skipped
    submod1   gated norm (w * rmsnorm(core) * silu(z)) -> W8A8 out_proj -> residual ->
              post-attention norm -> MoE (router softmax, top-k renormalised, W8A8 experts,
              sigmoid-gated shared expert) -> residual -> next layer's input norm

and runs the recorded request steps through two copies, each with its own state cache: an eager
copy (exact shapes, no padding, metadata built afresh each step) and a graph copy driven like
vLLM's V1 runner (`vllm/v1/worker/gpu_model_runner.py`), with the K draft tokens a decode
carried in the suite's run (K = 0: none): the uniform-decode decision and the dispatcher pick
FULL, PIECEWISE or eager and the capture size a step pads to; a persistent `input_ids` is
addressed by slicing; graphs are captured lazily on the first step of a key, after a warm-up
run, into one pool. PIECEWISE: submod0 and submod1 are graphs and gdn_core runs eagerly between
them. FULL (a uniform decode, in `full_and_piecewise` or `full_decode_only`): the whole chain is
one graph, captured over the GDN metadata builder's persistent buffers (state indices, and with
drafts the spec rows' 1+K state blocks, query start locations and accepted counts), which the
builder refreshes only for a batch with no prefill (`vllm/v1/attention/backends/gdn_attn.py:
GDNAttentionMetadataBuilder.build`); a FULL replay's padded rows read whatever the last such
staging, or the capture, left there unless staging pads them. The builder reads each request's
blocks from the runner's persistent batch and block table (rows that outlive requests, holes,
`condense()`, a commit before each build). With prefix caching's block size (vLLM's
mamba_cache_mode "align") a request's row grows with its sequence, its state indices start at its
running column, and before each step every copy makes the step's forward copies outside any graph
(`preprocess_mamba`, and the previous step's block-boundary saves). A dummy step (an idle
data-parallel rank's `_dummy_run(1+K, uniform_decode=True)`) runs nothing in the eager copy; in the
graph copy a FULL dispatch commits, re-stages and replays as the rules say, writing the state
blocks of whatever rows it read. After every step every island output (live rows) and the state
blocks of the step's requests (after a dummy step, every block) are compared bit for bit; the
first difference is printed.

Graphs: torch.cuda.CUDAGraph on CUDA; torch.xpu.XPUGraph (torch >= 2.11) or
intel_extension_for_pytorch.xpu.XPUGraph (IPEX 2.6/2.7) on XPU; on a CPU, a small emulation
(below, `Tape`): the ops of one run are recorded under a TorchDispatchMode and replayed on the
same tensor objects, so addresses, Python-side decisions and the op sequence are frozen as a
device graph freezes them (no streams, no memory-pool reuse: not needed here).

The GDN prefill (a step with a prefill) runs eagerly in both copies. The kernel math (section
"math") is the suite's own reference code (`kernels/*/reference.py` and their helpers), copied
in when this script was written; the layer wiring, the runner, the tape and the comparison are
this template's own (`repro/report/standalone/gdn_chain.py`).

Usage:  python repro_standalone.py [--device auto|cpu|cuda|xpu] [--repair [NAME]] [--no-hazard]
Exit:   1 the divergence reproduced (or the replay-side assertion refused a FULL replay), 0 replay ==
        eager bit for bit at every step, 2 bad usage.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

SPEC_JSON = None  # @SPEC@ (filled in by `repro report`)


# What the knobs do here: the options of the suite's hazard table (repro/hazards.py) that this
# script rebuilds, at their defaults. `repro report` writes, into the spec, which options each
# hazard and repair of the table sets (only rows marked `standalone`); the script reads options,
# never a hazard's name.
# The control rules (`control.*`) start from the stack profile the suite ran (`spec["rules"]`), which
# a hazard or repair of the table may then change like any other option; their defaults are the
# fixed forms.
OPTION_DEFAULTS = {"runner.pad": "sentinel", "runner.copy_inputs": False, "runner.recapture": False,
                   "runner.eager_families": [], "island.fresh_core_out": False, "island.trim_moe_to_context": False,
                   "control.uniform_decode": "phase-aware", "control.assert_full_past_prompt": True,
                   "control.first_chunk": "is-prefilling",
                   "control.clear_finished_row": True, "control.move_row_zeroes_source": True,
                   "control.dummy_commits_block_table": True, "control.dummy_restages": True,
                   "control.zero_draft_spec_row": True,
                   # read by `repro report`, which writes the default capture list the script runs (spec["sizes"])
                   "control.decode_capture_sizes": True}


class ReplayRefused(RuntimeError):
    """The replay-side assertion (`control.assert_full_past_prompt`) stopped a FULL replay."""


def die(msg: str, code: int = 2):
    print(f"repro_standalone: error: {msg}", file=sys.stderr)
    sys.exit(code)


def options_for(spec, hazards, repairs):
    """(eager copy's options, replay copy's options): the stack's control rules, then hazards'
    settings, then the repairs' (a repair wins); a family set is a union; an island option of a
    replay-only hazard (a compiler's doing to a captured piece) reaches the replay copy alone."""
    stack = {f"control.{k}": v for k, v in spec.get("rules", {}).items()}
    eager, replay = {**OPTION_DEFAULTS, **stack}, {**OPTION_DEFAULTS, **stack}
    eager["runner.eager_families"] = replay["runner.eager_families"] = list(spec["families"])
    rows = [(spec["knobs"]["hazards"][h], True) for h in hazards] + \
        [(spec["knobs"]["repairs"][r], False) for r in repairs]
    for row, is_hazard in rows:
        for key, value in row["sets"].items():
            targets = [replay] if is_hazard and row.get("replay_only") and key.startswith("island.") \
                else [eager, replay]
            for opts in targets:
                if key == "runner.eager_families":
                    opts[key] = sorted(set(opts[key]) | set(value))
                else:
                    opts[key] = value
    return eager, replay


# ============================================================================ math
# @MATH@ (the suite's reference kernels, copied in by `repro report`)


# ---- the driver's names for them (as `kernels.linear` and `kernels.moe_block` call them)

def linear(x, lin):
    """lin = (weight, scale): W8A8 when scale is a tensor, else a bf16 F.linear."""
    w, s = lin
    if s is None:
        return F.linear(x, w)
    y = w8a8_linear_reference(x.reshape(-1, x.shape[-1]), w, s, None)
    return y.reshape(*x.shape[:-1], y.shape[-1])


def moe(x, P, top_k, renormalize):
    return moe_reference(x, P["router"], P["experts.w13"], P.get("experts.w13_scale"), P["experts.w2"],
                         P.get("experts.w2_scale"), *P.lin("shared_gate_up"), *P.lin("shared_down"),
                         P["shared_expert_gate"], top_k, renormalize)


# ============================================================================ weights

class Weights(dict):
    def lin(self, name):
        return self[name + ".weight"], self.get(name + ".scale")


LINEARS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "shared_gate_up", "shared_down")


def seeded_weights(spec) -> dict:
    """Random weights of the checkpoint's shapes and dtypes, from a seed (CPU generator, so the
    same on every device). W8A8 linears are quantised the Quark way (scale = amax / 127.5)."""
    c, q = spec["config"], spec["quantised"]
    g = torch.Generator().manual_seed(int(spec["weights"]["seed"]))
    H, hk, hv, dk, dv = c["hidden"], c["hk"], c["hv"], c["dk"], c["dv"]
    E, I, Is, K = c["experts"], c["moe_inter"], c["shared_inter"], c["conv_kernel"]
    conv_dim = 2 * hk * dk + hv * dv

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=g) * std + mean

    def quantised(w):
        scale = (w.abs().amax(-1) / 127.5).to(torch.bfloat16).float()
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        return torch.round(w / scale.unsqueeze(-1)).clamp(-128, 127).to(torch.int8), scale

    out = {}

    def put_linear(name, n, k, is_q):
        w = normal((n, k), 1.0 / math.sqrt(k))
        if is_q:
            out[name + ".weight"], out[name + ".scale"] = quantised(w)
        else:
            out[name + ".weight"] = w.to(torch.bfloat16)

    out["embed_rows"] = normal((len(spec["embed_ids"]), H), 1.0).to(torch.bfloat16)
    for name in ("input_layernorm", "post_attention_layernorm", "next_norm"):
        out[name] = normal((H,), 0.1).to(torch.bfloat16)
    put_linear("in_proj_qkv", conv_dim, H, q["in_proj_qkv"])
    put_linear("in_proj_z", hv * dv, H, q["in_proj_z"])
    put_linear("in_proj_b", hv, H, q["in_proj_b"])
    put_linear("in_proj_a", hv, H, q["in_proj_a"])
    out["conv1d_weight"] = normal((conv_dim, K), 1.0 / math.sqrt(K)).to(torch.bfloat16)
    out["A_log"] = torch.log(torch.rand(hv, generator=g) * 15 + 1).to(torch.bfloat16)
    out["dt_bias"] = normal((hv,), 0.5).to(torch.bfloat16)
    out["norm_weight"] = normal((dv,), 0.1, 1.0).to(torch.bfloat16)
    put_linear("out_proj", H, hv * dv, q["out_proj"])
    out["router"] = normal((E, H), 1.0 / math.sqrt(H)).to(torch.bfloat16)
    w13 = normal((E, 2 * I, H), 1.0 / math.sqrt(H))
    w2 = normal((E, H, I), 1.0 / math.sqrt(I))
    if q["experts"]:
        out["experts.w13"], out["experts.w13_scale"] = quantised(w13)
        out["experts.w2"], out["experts.w2_scale"] = quantised(w2)
    else:
        out["experts.w13"], out["experts.w2"] = w13.to(torch.bfloat16), w2.to(torch.bfloat16)
    put_linear("shared_gate_up", 2 * Is, H, q["shared_gate_up"])
    put_linear("shared_down", H, Is, q["shared_down"])
    out["shared_expert_gate"] = normal((1, H), 1.0 / math.sqrt(H)).to(torch.bfloat16)
    return out


def load_weights(spec, device) -> Weights:
    src = spec["weights"]
    if src["source"] == "seed":
        tensors = seeded_weights(spec)
    else:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), src["file"])
        if not os.path.isfile(path):
            die(f"the weights file {src['file']} must lie beside this script")
        try:
            from safetensors.torch import load_file
        except ImportError:
            die("the embedded weights need `pip install safetensors`")
        tensors = load_file(path)
    P = Weights({k: v.to(device) for k, v in tensors.items()})
    # token id -> row of `embed_rows` (only the rows the steps use are kept)
    row_of = torch.zeros(spec["config"]["vocab"], dtype=torch.long)
    row_of[torch.tensor(spec["embed_ids"], dtype=torch.long)] = torch.arange(len(spec["embed_ids"]))
    P["row_of"] = row_of.to(device)
    return P


# ============================================================================ the islands

class Context:
    """Host values the runner sets before a call (vLLM's forward context); reads are recorded,
    so the runner knows which values a capture froze."""

    def __init__(self):
        self.values, self.reads = {}, set()

    def get(self, key):
        self.reads.add(key)
        return self.values.get(key)


class LayerCopy:
    """submod0 -> gdn_core -> submod1 with its own state cache."""

    def __init__(self, P, spec, opts, device):
        c = spec["config"]
        self.P, self.c, self.opts, self.device = P, c, opts, device
        self.sentinel, k = spec["sentinel"], spec.get("spec_tokens", 0)
        # a request holds 1+k state blocks (its spec columns), more with a block size (`cache_slots`
        # rows of 1+k); sentinel 0: row 0 is the null block
        rows = spec.get("cache_slots", spec["num_slots"]) * (1 + k) + (1 if self.sentinel == 0 else 0)
        conv_dim = 2 * c["hk"] * c["dk"] + c["hv"] * c["dv"]
        # with k draft tokens a conv row keeps k more columns (vLLM's `gated_delta_net_state_shape`)
        self.conv = torch.zeros(rows, conv_dim, c["conv_kernel"] - 1 + k, dtype=torch.bfloat16, device=device)
        self.ssm = torch.zeros(rows, c["hv"], c["dk"], c["dv"], dtype=torch.float32, device=device)
        self.ctx = Context()

    def state(self):
        return {"conv_state": self.conv, "ssm_state": self.ssm}

    def submod0(self, input_ids):
        P, c = self.P, self.c
        residual = P["embed_rows"][P["row_of"][input_ids]]
        x = rms_norm_reference(residual, P["input_layernorm"], c["eps"])
        z = linear(x, P.lin("in_proj_z"))
        return {"qkv": linear(x, P.lin("in_proj_qkv")), "z": z, "b": linear(x, P.lin("in_proj_b")),
                "a": linear(x, P.lin("in_proj_a")), "residual": residual,
                # the buffer the splitting op writes into: allocated here, so a graph output in the pool
                "core_out": torch.empty(x.shape[0], c["hv"], c["dv"], dtype=torch.bfloat16, device=x.device)}

    def _split(self, y):
        c = self.c
        kd, t = c["hk"] * c["dk"], y.shape[0]
        return (y[:, :kd].reshape(t, c["hk"], c["dk"]), y[:, kd:2 * kd].reshape(t, c["hk"], c["dk"]),
                y[:, 2 * kd:].reshape(t, c["hv"], c["dv"]))

    def gdn_core(self, qkv, b, a, core_out, meta):
        """The splitting op: writes core_out and the state caches in place. As vLLM's `_forward_core`
        (`vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py`): spec rows through the spec
        conv update and recurrence, the rest through the decode and prefill kernels; in a batch with
        both, each part's tokens are gathered by index and its outputs scattered back."""
        out = torch.empty_like(core_out) if self.opts["island.fresh_core_out"] else core_out
        if not meta.get("num_spec_decodes"):
            return self._non_spec(qkv, b, a, out, meta, meta["num_tokens"])
        if not meta["mixed"]:
            n = meta["num_tokens"]
            out[:n].copy_(self._spec(qkv[:n], b[:n], a[:n], meta))
            return out
        idx, rest = meta["spec_token_indx"], meta["non_spec_token_indx"]
        out.index_copy_(0, idx, self._spec(qkv.index_select(0, idx), b.index_select(0, idx), a.index_select(0, idx),
                                           meta))
        part = torch.empty(len(rest), *out.shape[1:], dtype=out.dtype, device=out.device)
        self._non_spec(qkv.index_select(0, rest), b.index_select(0, rest), a.index_select(0, rest), part, meta,
                       len(rest))
        out.index_copy_(0, rest, part)
        return out

    def _spec(self, qkv, b, a, meta):
        """Spec rows: the state read from column num_accepted-1, the state after token t into column t."""
        P, s = self.P, self.sentinel
        idx, acc, qsl = meta["spec_state_indices"], meta["num_accepted"], meta["spec_query_start_loc"]
        q, k, v = self._split(causal_conv1d_update_spec_reference(qkv, P["conv1d_weight"], self.conv,
                                                                  idx[:, 0].contiguous(), acc, qsl, s))
        g, beta = gdn_gating_reference(P["A_log"], a, P["dt_bias"], b)
        return gated_delta_rule_spec_reference(q, k, v, g, beta, self.ssm, idx, acc, qsl, s)

    def _non_spec(self, qkv, b, a, out, meta, nt):
        """Decodes (the first num_decodes rows, a token each), then prefills, into `out`."""
        P, s = self.P, self.sentinel
        nd = meta["num_decodes"]
        if nd:
            idx = meta["state_indices"][:nd]
            q, k, v = self._split(causal_conv1d_update_reference(qkv[:nd], P["conv1d_weight"], self.conv, idx, s))
            g, beta = gdn_gating_reference(P["A_log"], a[:nd], P["dt_bias"], b[:nd])
            out[:nd].copy_(gated_delta_rule_decode_reference(q, k, v, g, beta, self.ssm, idx, s))
        if nt > nd:
            qsl = meta["query_start_loc"][nd:] - nd
            idx, init = meta["state_indices"][nd:], meta["has_initial_state"][nd:]
            q, k, v = self._split(causal_conv1d_fn_reference(qkv[nd:nt], P["conv1d_weight"], self.conv, qsl, idx,
                                                             init, s))
            g, beta = gdn_gating_reference(P["A_log"], a[nd:nt], P["dt_bias"], b[nd:nt])
            out[nd:nt].copy_(gated_delta_rule_prefill_reference(q, k, v, g, beta, self.ssm, qsl, idx, init, s))
        return out

    def submod1(self, core_out, z, residual):
        P, c = self.P, self.c
        t = core_out.shape[0]
        gated = rms_norm_gated_reference(core_out, z.reshape(t, c["hv"], c["dv"]), P["norm_weight"], c["eps"])
        h, x = add_rms_norm_reference(residual, linear(gated.reshape(t, -1), P.lin("out_proj")),
                                      P["post_attention_layernorm"], c["eps"])
        if self.opts["island.trim_moe_to_context"]:
            # vLLM's MoE trims to the forward context's token count: a Python int a graph freezes
            n = self.ctx.get("num_actual_tokens")
            m = torch.zeros_like(x)
            m[:n] = moe(x[:n], P, c["top_k"], c["renormalize"])
        else:
            m = moe(x, P, c["top_k"], c["renormalize"])
        hidden, next_normed = add_rms_norm_reference(h, m, P["next_norm"], c["eps"])
        return {"hidden": hidden, "next_normed": next_normed}


SUBMOD0_OUT = ("qkv", "z", "b", "a", "residual")
SUBMOD1_OUT = ("hidden", "next_normed")


# ============================================================================ the control path
# vLLM's V1 runner on a step: which graph it replays, and the GDN metadata its builder hands the
# core. With k draft tokens a decode (`spec["spec_tokens"]`), a decode row's query is its drafts plus
# one token, its state is 1+k columns of its block-table row (the first ones, or with a block size
# the ones from its running column) and its accepted count names the column it continues from. The
# rules are the ones the suite ran with (its stack profile and knobs: the `control.*` options); a
# step's optional lists default as the suite's `StepBatch` defaults them.

# vLLM's graph modes as (uniform-decode runtime, mixed runtime) (`vllm/config/compilation.py:
# CUDAGraphMode`); `full` resolves to FULL_AND_PIECEWISE for GDN, whose builder captures uniform
# batches only (`GDNAttentionMetadataBuilder._cudagraph_support = UNIFORM_BATCH`).
MODES = {"none": (None, None), "piecewise": ("piecewise", "piecewise"), "full": ("full", "piecewise"),
         "full_decode_only": ("full", None), "full_and_piecewise": ("full", "piecewise")}


def computed(st):
    return st["num_computed"] if "num_computed" in st else [1 if h else 0 for h in st["has_initial_state"]]


def prompts(st):
    return st["prompt_lens"] if "prompt_lens" in st else \
        [1 if h else q for q, h in zip(st["query_lens"], st["has_initial_state"])]


def prefilling(st):
    """Each request still in its prompt (vLLM: `num_computed_tokens < num_prompt_tokens`)."""
    return [c < p for c, p in zip(computed(st), prompts(st))]


def drafts(st):
    return st.get("draft_lens") or [0] * len(st["query_lens"])


def draft_counts(st, zero_draft=True):
    """`num_decode_draft_tokens` (`vllm/v1/worker/gpu_model_runner.py: GPUModelRunner._prepare_inputs`):
    a row's draft count where its query is exactly its drafts plus one token, else -1 (a prefill
    chunk); a one-token row past its prompt is a spec row with 0 drafts (`zero_draft`,
    `control.zero_draft_spec_row`; vLLM 0.26.0 leaves it -1)."""
    out = []
    for q, d, c, p in zip(st["query_lens"], drafts(st), computed(st), prompts(st)):
        n = d if d > 0 and q == d + 1 else -1
        out.append(0 if zero_draft and n < 0 and c >= p and q == 1 else n)
    return out


def block_rows(st):
    """Each request's state blocks: its `blocks` row, or its slot alone."""
    return st["blocks"] if "blocks" in st else [[s] for s in st["slots"]]


def state_columns(st, i, width):
    """Request i's `width` (1+k) state indices: the first columns of its block-table row, or with
    prefix caching's block size the ones from its running column `(seq_len - 1) // block_size`
    (`vllm/v1/attention/backends/utils.py: mamba_get_block_table_tensor`, mode "align")."""
    row, bs = block_rows(st)[i], st.get("block_size")
    start = max((computed(st)[i] + st["query_lens"][i] - 1) // bs, 0) if bs else 0
    return list(row[start:start + width])


def state_blocks(st):
    """Each request's state index (its running block)."""
    return [state_columns(st, i, 1)[0] for i in range(len(st["query_lens"]))]


def forward_copies(st):
    """`vllm/v1/worker/mamba_utils.py: preprocess_mamba` with a block size: where a request's running
    column moved from `prev_cols` (-1: nothing computed) to `state_cols`, its conv state comes from
    block[prev] shifted by accepted-1 tokens and its SSM state from block[prev + accepted - 1] (the
    column of its last kept token), into block[curr], and its accepted count becomes 1. The previous
    step's block-boundary saves (`post_copies`, which vLLM makes at the end of that step:
    `postprocess_mamba_align_gpu`) come first, a dummy step's too. Returns the copies as (dst,
    conv_src, conv_offset, ssm_src) and the accepted counts the metadata then reads."""
    accepted = list(st.get("num_accepted") or [1] * len(st["query_lens"]))
    copies = [tuple(c) for c in st.get("post_copies", [])]
    if not st.get("block_size") or st.get("dummy"):
        return copies, accepted
    for i, (row, prev, curr) in enumerate(zip(block_rows(st), st["prev_cols"], st["state_cols"])):
        if prev != -1 and prev != curr:
            a = accepted[i]
            copies.append((row[curr], row[prev], a - 1, row[prev + a - 1]))
            accepted[i] = 1
    return copies, accepted


def copy_states(copy, copies):
    """The forward copies on one copy's state, outside any graph: a conv window shifted by the offset
    fills the destination's first width-offset tokens (`get_conv_copy_spec`)."""
    for dst, conv_src, offset, ssm_src in copies:
        w = copy.conv.shape[-1] - offset
        src = copy.conv[conv_src, :, offset:]
        copy.conv[dst, :, :w].copy_(src.clone() if conv_src == dst else src)
        if ssm_src != dst:
            copy.ssm[dst].copy_(copy.ssm[ssm_src])


def preprocess(copy, st):
    """The step's forward copies on `copy`; the step as the metadata builder then reads it."""
    copies, accepted = forward_copies(st)
    copy_states(copy, copies)
    return {**st, "num_accepted": accepted}


def num_decodes(st, rule):
    """How many leading rows are decodes (`vllm/v1/attention/backends/gdn_attn.py:
    GDNAttentionMetadataBuilder.build`, the non-spec split): `query-len` (vLLM 0.26.0,
    `split_decodes_and_prefills(m, decode_threshold=1)`) calls every one-token row a decode;
    `is-prefilling` (vLLM 0.33.0, vLLM #51565) makes a one-token first chunk with no prior state a
    prefill."""
    if rule == "query-len":
        prefill = [q > 1 for q in st["query_lens"]]
    else:
        prefill = [q > 1 or (c <= 0 and p) for q, c, p in zip(st["query_lens"], computed(st), prefilling(st))]
    return prefill.index(True) if True in prefill else len(prefill)


def held_out(st, rule):
    """The requests a fixed form of the uniform-decode rule holds out of a uniform decode: each
    before its prompt's end (vLLM PR #53059, PR #47123), or with `phase-aware` (vLLM PR #51865,
    `vllm/v1/worker/gpu/model_runner.py: GPUModelRunner.gather_batch_req_state`) each in its prefill
    phase (`prefill_lens`: a resumed request's recompute included) unless its row is one new token
    over existing context."""
    if rule != "phase-aware":
        return prefilling(st)
    pre = st.get("prefill_lens") or prompts(st)
    return [c < p and not (n - d == 1 and c > 0) for c, p, n, d in zip(computed(st), pre, st["query_lens"], drafts(st))]


def uniform_decode(st, rule, k=0):
    """`vllm/v1/worker/gpu_model_runner.py: GPUModelRunner._is_uniform_decode`: every query is 1+k
    tokens. `shape` (vLLM 0.33.0) asks only that; vLLM PR #53059 (and PR #47123 for a hybrid
    model such as this one) also need every request past its prompt; `phase-aware` (vLLM PR #51865,
    the V2 runner's `decode_graph_eligible`) needs no request in its prefill phase (`prefill_lens`: a
    resumed request's recompute included) unless its row is one new token over existing context."""
    q = st["query_lens"]
    shape = max(q) == 1 + k and sum(q) == len(q) * (1 + k)
    return shape if rule == "shape" else shape and not any(held_out(st, rule))


def capture_sizes(sizes, full_decode, k):
    """`vllm/config/compilation.py: CompilationConfig.adjust_cudagraph_sizes_for_spec_decode`: with a
    FULL decode mode and 1+k > 1 every size is rounded up to a multiple of 1+k, and sizes above the
    largest one asked for are dropped."""
    sizes, q = sorted(set(sizes)), 1 + k
    if not full_decode or q == 1:
        return sizes
    rounded = sorted({-(-s // q) * q for s in sizes if -(-s // q) * q <= sizes[-1]})
    return rounded or ([q] if q <= sizes[-1] else [])


class InputBatch:
    """The runner's persistent batch: a row per request and the block table of their state blocks
    (`vllm/v1/worker/gpu_input_batch.py: InputBatch`, `vllm/v1/worker/block_table.py: BlockTable`).
    Rows outlive requests: a request that leaves makes a hole (its row cleared if
    `control.clear_finished_row`, `remove_request`), a new one takes the lowest hole, and
    `condense()` moves the last live rows into the lowest holes (zeroing the row it moved from if
    `control.move_row_zeroes_source`, `move_row`). The table is host-side; `commit(n)`
    (`commit_block_table`) copies its first n rows to the copy the metadata reads, whose other rows
    keep what they held: what a dummy run reads past the live rows."""

    def __init__(self, max_reqs, width, null, opts):
        self.null, self.opts = null, opts
        self.table = [[null] * width for _ in range(max_reqs)]
        self.committed = [row[:] for row in self.table]
        self.row_of = {}
        self.num_rows = 0  # rows in use, holes included
        self.seen = set()  # requests `update` has scheduled before (the others are new)

    def remove(self, rid):
        row = self.row_of.pop(rid, None)
        if row is not None and self.opts["control.clear_finished_row"]:
            self.table[row] = [self.null] * len(self.table[row])

    def _fit(self, width):
        """Widen the table and its committed copy to `width` columns of the null block (vLLM sizes the
        table for the longest sequence up front)."""
        for table in (self.table, self.committed):
            for row in table:
                row.extend([self.null] * (width - len(row)))

    def add(self, rid, blocks):
        used = set(self.row_of.values())
        row = next((r for r in range(self.num_rows) if r not in used), self.num_rows)
        if row >= len(self.table):
            raise RuntimeError(f"no free row: {len(self.table)} rows are in use")
        self._fit(len(blocks))
        self.table[row][:len(blocks)] = list(blocks)
        self.row_of[rid] = row
        self.num_rows = max(self.num_rows, row + 1)

    def condense(self):
        live = sorted(self.row_of.values())
        rid_at = {r: rid for rid, r in self.row_of.items()}
        for hole in [r for r in range(self.num_rows) if r not in set(live)]:
            if not live or hole >= live[-1]:
                break
            last = live.pop()
            self.table[hole] = self.table[last][:]
            if self.opts["control.move_row_zeroes_source"]:
                self.table[last] = [self.null] * len(self.table[last])
            self.row_of[rid_at[last]] = hole
            live = sorted(live + [hole])
        self.num_rows = len(self.row_of)

    def update(self, scheduled, grown=False, finished=()):
        """`_update_states`, in its order: a request not scheduled this step leaves (finished,
        preempted or waiting: vLLM removes it and adds it back when it is scheduled again), and so
        does one whose blocks changed (resumed after a preemption); then requests new to the runner
        take rows, then the other absent ones (resumed); then `condense()`. `grown` (a block size): a
        row grows with its request, so one that stays is rewritten in place and only one in
        `finished` (preempted since) is added anew."""
        now = dict(scheduled)
        for rid in [r for r in self.row_of if r not in now]:
            self.remove(rid)
        for rid, blocks in scheduled:
            row = self.row_of.get(rid)
            if row is not None and grown:
                if rid in finished:
                    self.remove(rid)
                else:
                    self._fit(len(blocks))
                    self.table[row][:len(blocks)] = list(blocks)
            elif row is not None and self.table[row][:len(blocks)] != list(blocks):
                self.remove(rid)
        absent = [(rid, blocks) for rid, blocks in scheduled if rid not in self.row_of]
        for rid, blocks in [x for x in absent if x[0] not in self.seen] + [x for x in absent if x[0] in self.seen]:
            self.add(rid, blocks)
        self.seen.update(now)
        self.condense()

    def commit(self, n):
        self.committed[:n] = [row[:] for row in self.table[:n]]

    def rows(self, rids):
        """The committed rows of these requests, in this order."""
        return [self.committed[self.row_of[r]] for r in rids]


def _qsl(lens):
    out = [0]
    for q in lens:
        out.append(out[-1] + q)
    return out


class MetadataBuilder:
    """The GDN metadata builder (`vllm/v1/attention/backends/gdn_attn.py:
    GDNAttentionMetadataBuilder.build`). Spec rows are rows with a draft count >= 0 (k > 0 only);
    beside them one-token non-spec rows go to the prefill kernel. With FULL graphs (`full_graphs`)
    it keeps persistent buffers of `rows` = `decode_cudagraph_max_bs` rows (min(max_num_seqs *
    (1+k), the largest capture size after rounding)), and refreshes them ONLY for a batch with no
    prefill (its two decode staging branches: spec rows alone, at most `rows` of them and `rows`
    spec tokens; or non-spec decodes alone, at most `rows`), whatever graph the step then runs: a
    FULL graph is captured over those buffers and reads, for every padded row, what the last such
    staging left there. Past the live rows staging writes `pad` (vLLM 0.33.0: the null block, the
    kernel's sentinel; None: nothing, the rows keep what an earlier staging or capture wrote), query
    start locations repeat their last value and accepted counts are 1. Without FULL graphs (the
    eager copy) every step gets fresh tensors."""

    def __init__(self, k, rows, device, full_graphs, pad, first_chunk, zero_draft=True):
        self.k, self.rows, self.device = k, rows, device
        self.full_graphs, self.pad, self.first_chunk, self.zero_draft = full_graphs, pad, first_chunk, zero_draft
        # `torch.empty` in vLLM; zeros here, so a run depends on its steps alone
        i32 = dict(dtype=torch.int32, device=device)
        self.state_indices = torch.zeros(rows, **i32)
        self.spec_state_indices = torch.zeros(rows, 1 + k, **i32)
        self.spec_query_start_loc = torch.zeros(rows + 1, **i32)
        self.num_accepted = torch.ones(rows, **i32)

    def _t(self, values, dtype=torch.int32):
        return torch.tensor(values, dtype=dtype, device=self.device)

    def _stage(self, buf, live, rows, pad):
        """Rows [:len(live)] from `live`, rows [len(live):rows] `pad` (None: left as they are)."""
        n = len(live)
        if n:
            buf[:n].copy_(self._t(live, buf.dtype))
        if rows > n and pad is not None:
            buf[n:rows].fill_(pad)

    def build(self, st, rows):
        """The core's metadata for step `st`, padded to `rows` rows (a FULL step's; else its own)."""
        if self.k and any(d >= 0 for d in draft_counts(st, self.zero_draft)):
            return self._spec(st, rows)
        qsl = _qsl(st["query_lens"])
        nd, n = num_decodes(st, self.first_chunk), len(st["query_lens"])
        if self.full_graphs and nd == n and rows <= len(self.state_indices):
            self._stage(self.state_indices, state_blocks(st), rows, self.pad)
            idx = self.state_indices[:n]
        else:
            idx = self._t(state_blocks(st))
        return {"query_start_loc": self._t(qsl), "state_indices": idx,
                "has_initial_state": self._t(st["has_initial_state"], torch.bool),
                "num_decodes": nd, "num_tokens": len(st["token_ids"])}

    def _spec(self, st, rows):
        q, k = st["query_lens"], self.k
        spec = [d >= 0 for d in draft_counts(st, self.zero_draft)]
        ns = sum(spec)
        nd = sum(1 for s, n in zip(spec, q) if not s and n == 1)
        np_ = sum(1 for s, n in zip(spec, q) if not s and n > 1)
        if nd and ns:  # beside spec rows, one-token non-spec rows go to the prefill kernel
            np_, nd = np_ + nd, 0
        spec_idx = [state_columns(st, i, 1 + k) for i in range(len(q)) if spec[i]]
        accepted = [a for a, s in zip(st["num_accepted"], spec) if s]
        spec_qsl = _qsl([n for n, s in zip(q, spec) if s])
        meta = {"num_spec_decodes": ns, "num_decodes": nd, "num_tokens": len(st["token_ids"]),
                "mixed": bool(nd or np_)}
        if not meta["mixed"]:
            if self.full_graphs and ns <= self.rows and sum(q) <= self.rows:  # the spec decode staging branch
                self._stage(self.spec_state_indices, spec_idx, rows, self.pad)
                self._stage(self.spec_query_start_loc, spec_qsl, rows + 1, spec_qsl[-1])
                self._stage(self.num_accepted, accepted, rows, 1)
                meta.update(spec_state_indices=self.spec_state_indices[:rows],
                            spec_query_start_loc=self.spec_query_start_loc[:rows + 1],
                            num_accepted=self.num_accepted[:rows])
            else:
                meta.update(spec_state_indices=self._t(spec_idx), spec_query_start_loc=self._t(spec_qsl),
                            num_accepted=self._t(accepted))
            return meta
        # the non-spec rows' tokens first, then the spec rows', each in order
        tokens = [(s, i) for i, (n, s) in enumerate(zip(q, spec)) for _ in range(n)]
        order = sorted(range(len(tokens)), key=lambda j: tokens[j][0])
        n_non = sum(1 for s, _ in tokens if not s)
        non = [i for i, s in enumerate(spec) if not s]
        meta.update(non_spec_token_indx=self._t(order[:n_non], torch.long),
                    spec_token_indx=self._t(order[n_non:], torch.long),
                    spec_state_indices=self._t(spec_idx), spec_query_start_loc=self._t(spec_qsl),
                    num_accepted=self._t(accepted), state_indices=self._t([state_columns(st, i, 1)[0] for i in non]),
                    query_start_loc=self._t(_qsl([q[i] for i in non])),
                    has_initial_state=self._t([computed(st)[i] > 0 for i in non], torch.bool))
        return meta

    def build_for_capture(self, size, sentinel):
        """`build_for_cudagraph_capture`, staged like a decode batch; the FULL graph is captured over
        this metadata (the buffers' views). k = 0: every row a one-token decode over the null block;
        k > 0: every row a spec row that kept all its 1+k tokens, over zero block-table rows."""
        if not self.k:
            self._stage(self.state_indices, [sentinel] * size, size, None)
            return {"query_start_loc": torch.arange(size + 1, dtype=torch.int32, device=self.device),
                    "state_indices": self.state_indices[:size], "has_initial_state": None,
                    "num_decodes": size, "num_tokens": size}
        q, rows = 1 + self.k, size // (1 + self.k)
        st = {"query_lens": [q] * rows, "draft_lens": [self.k] * rows, "num_computed": [1] * rows,
              "prompt_lens": [1] * rows, "num_accepted": [q] * rows, "blocks": [[0] * q] * rows,
              "token_ids": [0] * size}
        return self.build(st, rows)


def collect(o0, o1, n, core):
    out = {f"submod0.{k}": o0[k][:n] for k in SUBMOD0_OUT}
    out["gdn_core.core_out"] = core[:n]
    out.update({f"submod1.{k}": o1[k][:n] for k in SUBMOD1_OUT})
    return {k: v.clone() for k, v in out.items()}


class EagerRunner:
    """The reference: every island eager, exact shapes, no padding, metadata built afresh each step
    (a builder without FULL graphs never stages)."""

    def __init__(self, copy, opts, k):
        self.copy = copy
        self.builder = MetadataBuilder(k, 1, copy.device, False, None, opts["control.first_chunk"],
                                       opts["control.zero_draft_spec_row"])

    def step(self, st):
        c = self.copy
        st = preprocess(c, st)
        if st.get("dummy"):  # no metadata: the GDN layer treats the call as a warm-up, no state changes
            return {}
        c.ctx.values["num_actual_tokens"] = len(st["token_ids"])
        o0 = c.submod0(torch.tensor(st["token_ids"], dtype=torch.long, device=c.device))
        core = c.gdn_core(o0["qkv"], o0["b"], o0["a"], o0["core_out"], self.builder.build(st, len(st["slots"])))
        o1 = c.submod1(core, o0["z"], o0["residual"])
        return collect(o0, o1, len(st["token_ids"]), core)


# ============================================================================ graphs

def _storage(t):
    return t.untyped_storage().data_ptr()


aten = torch.ops.aten
HOST_SYNC = {aten._local_scalar_dense.default, aten.item.default, aten.nonzero.default, aten.equal.default}
ALLOC_ONLY = {aten.empty.memory_format, aten.empty_strided.default, aten.empty_like.default, aten.new_empty.default}


class Record(TorchDispatchMode):
    """Capture on the CPU: runs each op and records it with the very tensors it was called on."""

    def __init__(self, tape):
        super().__init__()
        self.tape = tape

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_SYNC:
            raise RuntimeError(f"{func} inside a captured piece needs a host value: a graph cannot hold it")
        result = func(*args, **kwargs)
        ins = {_storage(a) for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)}
        fresh = [] if func in ALLOC_ONLY else [(i, t) for i, t in enumerate(tree_flatten(result)[0])
                                               if isinstance(t, torch.Tensor) and _storage(t) not in ins]
        schema = getattr(func, "_schema", None)
        mutates = bool(schema) and any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        self.tape.ops.append((func, args, kwargs, fresh, mutates))
        return result


class Tape:
    """The CPU stand-in for a device graph: replay re-runs the recorded ops on the captured
    tensors and writes each result into the tensor recorded at capture. Views are skipped (they
    already alias the right bytes); allocation-only ops are not redone (nothing to compute)."""

    def __init__(self):
        self.ops = []

    def replay(self):
        with torch.inference_mode():
            for func, args, kwargs, fresh, mutates in self.ops:
                if not fresh and not mutates:
                    continue
                result = func(*args, **kwargs)
                if fresh:
                    flat = tree_flatten(result)[0]
                    for i, target in fresh:
                        target.copy_(flat[i])


class Graphs:
    """One interface over the CPU tape, CUDA graphs and XPU graphs (upstream or IPEX)."""

    def __init__(self, device):
        self.device = device
        self.api = "cpu tape (TorchDispatchMode record/replay)"
        self._pool = None
        if device == "cuda":
            self.api = "torch.cuda.CUDAGraph"
            self._pool = torch.cuda.graph_pool_handle()
        elif device == "xpu":
            if hasattr(torch.xpu, "XPUGraph") and hasattr(torch.xpu, "graph"):
                self.api, self._cls, self._ctx = "torch.xpu.XPUGraph", torch.xpu.XPUGraph, torch.xpu.graph
                self._pool = getattr(torch.xpu, "graph_pool_handle", lambda: None)()
            else:
                try:
                    import intel_extension_for_pytorch as ipex
                except ImportError:
                    die("XPU: this torch has no torch.xpu.XPUGraph and intel_extension_for_pytorch is absent")
                x = getattr(ipex, "xpu", None)
                if x is None or not hasattr(x, "XPUGraph"):
                    die(f"IPEX {getattr(ipex, '__version__', '?')} has no XPUGraph (IPEX 2.8 removed it): use "
                        "torch >= 2.11 (torch.xpu.XPUGraph) or IPEX 2.6.10/2.7.10")
                self.api, self._cls, self._ctx = "intel_extension_for_pytorch.xpu.XPUGraph", x.XPUGraph, x.graph
                self._pool = getattr(x, "graph_pool_handle", lambda: None)()

    def capture(self, fn):
        """(graph with .replay(), outputs); one shared pool for every capture, as vLLM does."""
        if self.device == "cpu":
            tape = Tape()
            with torch.inference_mode(), Record(tape):
                out = fn()
            return tape, out
        if self.device == "cuda":
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self._pool):
                out = fn()
            return g, out
        g = self._cls()
        with self._ctx(g, pool=self._pool):
            out = fn()
        return g, out

    def synchronize(self):
        if self.device == "cuda":
            torch.cuda.synchronize()
        elif self.device == "xpu":
            torch.xpu.synchronize()


class GraphRunner:
    """vLLM's V1 runner (`vllm/v1/worker/gpu_model_runner.py: GPUModelRunner`) on one step: the
    uniform-decode decision and the dispatcher pick the runtime (FULL, PIECEWISE or eager) and the
    size it pads to; the persistent `input_ids` is filled; a key's graphs are captured lazily into
    one pool after a warm-up; the metadata builder builds (and, for a batch with no prefill, stages)
    the step's metadata from the committed block table; then FULL replays the whole chain over the
    builder's buffer, PIECEWISE replays submod0 and submod1 around an eager gdn_core, eager runs the
    chain at the step's size. A dummy step (an idle data-parallel rank) is `_dummy_run`."""

    def __init__(self, copy, graphs, spec, opts):
        self.copy, self.graphs = copy, graphs
        self.decode, self.mixed = MODES[spec["mode"]]
        self.k = k = spec.get("spec_tokens", 0)
        self.sizes = capture_sizes(spec["sizes"], self.decode == "full", k)
        self.max_num_seqs = spec["num_slots"]
        self.opts = opts
        self.eager_family = set(opts["runner.eager_families"])
        self.sentinel = copy.sentinel
        n = max(spec["max_tokens"], max(self.sizes))
        self.input_ids = torch.zeros(n, dtype=torch.long, device=copy.device)
        rows = max(self.max_num_seqs, max(self.sizes))
        self.batch = InputBatch(rows, 1 + k, self.sentinel, opts)
        staging = min(self.max_num_seqs * (1 + k), max(self.sizes))  # `decode_cudagraph_max_bs`
        self.builder = MetadataBuilder(k, staging, copy.device, self.decode == "full", self._pad_value(),
                                       opts["control.first_chunk"], opts["control.zero_draft_spec_row"])
        self.captured = {}
        self.notes = []
        self.last = None  # the last step's (runtime, size, rows)

    def _pad_value(self):
        """What staging writes into padded rows: the kernel's sentinel, the other sentinel (0 where
        the kernel skips only -1), or None (a stale pad: the rows keep what was staged before)."""
        pad = self.opts["runner.pad"]
        if pad == "stale":
            return None
        if pad == "other":
            return 0 if self.sentinel != 0 else -1
        return self.sentinel

    def dispatch(self, st):
        """(runtime, tokens it runs, metadata rows) as `vllm/v1/cudagraph_dispatcher.py:
        CudagraphDispatcher.dispatch` picks them: pad to the smallest capture size; a uniform decode
        replays the FULL graph of that size when the mode has one (sizes that are multiples of 1+k
        up to (1+k) * max_num_seqs, a row every 1+k tokens); otherwise the PIECEWISE graphs when the
        mode has them; else eager (None) at the step's own size, as above the largest capture size. A
        dummy step dispatches 1+k tokens with the uniform flag forced (`_dummy_run(1+k,
        uniform_decode=True)`)."""
        if st.get("dummy"):
            return self._key(1 + self.k, 1, True)
        return self._key(len(st["token_ids"]), len(st["query_lens"]),
                         uniform_decode(st, self.opts["control.uniform_decode"], self.k))

    def _key(self, n, reqs, uniform):
        q = 1 + self.k
        size = next((s for s in self.sizes if s >= n), None)
        if size is None:
            return None, n, reqs
        if self.decode == "full" and size <= q * self.max_num_seqs and size % q == 0 and uniform:
            return "full", size, size // q
        if self.mixed == "piecewise":
            return "piecewise", size, reqs
        return None, n, reqs

    def _fill(self, n, size, st):
        """The live token ids; padded rows zero, or, with a stale pad, what the last step left."""
        self.input_ids[:n].copy_(torch.tensor(st["token_ids"], dtype=torch.long, device=self.copy.device))
        if size > n and self.opts["runner.pad"] != "stale":
            self.input_ids[n:size].zero_()

    def _capture(self, runtime, size):
        c = self.copy
        cap = {"size": size, "graphs": [], "outs": [], "ins1": None}
        c.ctx.reads.clear()
        ids = self.input_ids[:size]
        if runtime == "full":
            # captured over the builder's persistent buffer, staged for capture (all rows the null block)
            meta = self.builder.build_for_capture(size, self.sentinel)

            def chain():
                o0 = c.submod0(ids)
                c.gdn_core(o0["qkv"], o0["b"], o0["a"], o0["core_out"], meta)
                return {**o0, **c.submod1(o0["core_out"], o0["z"], o0["residual"])}
            saved = {k: v.clone() for k, v in c.state().items()}  # warm-up and capture on dummy slots
            chain()
            g, out = self.graphs.capture(chain)
            for k, v in c.state().items():
                v.copy_(saved[k])
            cap["graphs"], cap["outs"] = [g], [out]
        else:
            if "submod0" not in self.eager_family:
                c.submod0(ids)  # warm-up
                g0, o0 = self.graphs.capture(lambda: c.submod0(ids))
            else:
                g0, o0 = None, None
            cap["graphs"].append(g0)
            cap["outs"].append(o0)
            src = o0 if o0 is not None else c.submod0(ids)
            ins = {k: src[k] for k in ("core_out", "z", "residual")}
            if g0 is None:
                ins = {k: v.clone() for k, v in ins.items()}  # runner-owned, filled each step
                cap["ins1"] = ins
            if "submod1" not in self.eager_family and "moe" not in self.eager_family:
                c.submod1(**ins)  # warm-up
                g1, o1 = self.graphs.capture(lambda: c.submod1(**ins))
            else:
                g1, o1 = None, None
                cap["ins1"] = ins
            cap["graphs"].append(g1)
            cap["outs"].append(o1)
        cap["frozen"] = {k: c.ctx.values.get(k) for k in c.ctx.reads}
        return cap

    def _entry(self, runtime, size, step):
        """The graphs of this key, captured now if needed (or again when a forward-context value they
        froze has changed and recapture is on)."""
        c = self.copy
        cap = self.captured.get((runtime, size))
        if cap is not None:
            changed = {k: (v, c.ctx.values.get(k)) for k, v in cap["frozen"].items() if c.ctx.values.get(k) != v}
            if changed:
                self.notes.append(f"step {step}: {runtime} size {size} was captured with {cap['frozen']}, now "
                                  f"{ {k: now for k, (_, now) in changed.items()} } (a graph replays the frozen value)")
                if self.opts["runner.recapture"]:
                    cap = None
        if cap is None:
            cap = self.captured[(runtime, size)] = self._capture(runtime, size)
        return cap

    def _dummy_run(self, st):
        """`vllm/v1/worker/gpu_model_runner.py: GPUModelRunner._dummy_run(1+k, uniform_decode=True)`: only
        a FULL dispatch touches state. It commits the block table for its rows
        (`control.dummy_commits_block_table`), builds its metadata as for capture from the committed
        rows, one row of 1+k tokens, re-staging the builder's buffers (`control.dummy_restages`; else
        they keep the last real decode's staging), and replays; its outputs are discarded."""
        runtime, size, rows = self.last
        if runtime != "full":
            return
        if self.opts["control.dummy_commits_block_table"]:
            self.batch.commit(rows)
        cap = self._entry(runtime, size, st["step"])
        if self.opts["control.dummy_restages"]:
            q = 1 + self.k
            self.builder.build({"query_lens": [q], "draft_lens": [self.k], "num_computed": [1], "prompt_lens": [1],
                                "num_accepted": [q], "has_initial_state": [True], "token_ids": [0] * q,
                                "blocks": [self.batch.committed[0]]}, rows)
        cap["graphs"][0].replay()

    def pad_rows(self, st):
        """(size, padded rows' state indices) of a FULL step, as its replay read them; None otherwise."""
        if self.last is None or self.last[0] != "full":
            return None
        _, size, rows = self.last
        buf = self.builder.spec_state_indices if self.k else self.builder.state_indices
        return size, buf[len(st["query_lens"]):rows].tolist()

    def step(self, st):
        c = self.copy
        self.batch.update(list(zip(st["request_ids"], block_rows(st))), bool(st.get("block_size")),
                          set(st.get("finished", [])))  # `_update_states`
        runtime, size, rows = self.last = self.dispatch(st)
        if st.get("dummy"):
            preprocess(c, st)
            self._dummy_run(st)
            return {}
        # vLLM PR #55123 asserts every request of a FULL replay past its prompt (the rule's own test)
        if runtime == "full" and self.opts["control.assert_full_past_prompt"] and \
                any(held_out(st, self.opts["control.uniform_decode"])):
            raise ReplayRefused(f"step {st['step']}: a FULL graph of {size} tokens was dispatched for a batch with "
                                "a request still in its prompt (the replay-side assertion)")
        n = len(st["token_ids"])
        self._fill(n, size, st)
        c.ctx.values["num_actual_tokens"] = n
        cap = self._entry(runtime, size, st["step"]) if runtime else None
        st = preprocess(c, st)  # outside any graph, before the metadata reads the running columns
        # after a capture, which stages its own metadata first: the committed rows of the step's requests
        self.batch.commit(self.batch.num_rows)
        meta = self.builder.build({**st, "blocks": self.batch.rows(st["request_ids"])}, rows)
        if cap is None:
            o0 = c.submod0(self.input_ids[:n])
            core = c.gdn_core(o0["qkv"], o0["b"], o0["a"], o0["core_out"], meta)
            return collect(o0, c.submod1(core, o0["z"], o0["residual"]), n, core)
        if runtime == "full":
            cap["graphs"][0].replay()
            o = cap["outs"][0]
            return collect(o, o, n, o["core_out"])
        g0, g1 = cap["graphs"]
        if g0 is not None:
            g0.replay()
            o0 = cap["outs"][0]
        else:
            o0 = c.submod0(self.input_ids[:size])
        fresh = c.gdn_core(o0["qkv"][:n], o0["b"][:n], o0["a"][:n], o0["core_out"][:n], meta)
        if fresh.data_ptr() != o0["core_out"].data_ptr() and self.opts["runner.copy_inputs"]:
            o0["core_out"][:n].copy_(fresh)  # the splitting op allocated: copy into the captured input
        ins = cap["ins1"]
        if ins is not None:
            for k in ins:
                if ins[k].data_ptr() != o0[k].data_ptr():
                    ins[k].copy_(o0[k])
        if g1 is not None:
            g1.replay()
            o1 = cap["outs"][1]
        else:
            o1 = c.submod1(fresh, o0["z"][:n], o0["residual"][:n])
        return collect(o0, o1, n, fresh)


# ============================================================================ lockstep

def first_difference(st, eager_out, replay_out, eager, replay):
    for key in eager_out:
        a, b = eager_out[key], replay_out[key]
        if not torch.equal(a, b):
            bad = ~(a == b).reshape(a.shape[0], -1).all(-1)
            row = int(bad.int().argmax())
            acc, rid, slot = 0, None, None
            for r, s, q in zip(st["request_ids"], st["slots"], st["query_lens"]):
                if row < acc + q:
                    rid, slot = r, s
                    break
                acc += q
            island, tensor = key.split(".", 1)
            return {"step": st["step"], "island": island, "tensor": tensor, "row": row, "request": rid, "slot": slot,
                    "max_abs": float((a.float() - b.float()).abs().nan_to_num(float("inf")).max())}
    for name, ta in eager.state().items():
        tb = replay.state()[name]
        # after a dummy run every block: its writes go wherever the rows it read point
        slots = range(ta.shape[0]) if st.get("dummy") else \
            sorted({b for row in block_rows(st) for b in row} | set(st.get("live_slots", [])))
        for slot in slots:
            at = slot % ta.shape[0]
            if not torch.equal(ta[at], tb[at]):
                rid = next((r for r, s in zip(st["request_ids"], st["slots"]) if s == slot), None)
                return {"step": st["step"], "island": "gdn_core", "tensor": name, "row": None, "request": rid,
                        "slot": slot, "max_abs": float((ta[at].float() - tb[at].float()).abs().max())}
    return None


def describe(div):
    where = f"row {div['row']} " if div["row"] is not None else ""
    who = f"(request {div['request']}, slot {div['slot']}) " \
        if div["request"] is not None or div["slot"] is not None else ""
    return f"step {div['step']}: {div['island']}.{div['tensor']} {where}{who}max abs diff {div['max_abs']:.4g}"


def main(argv=None) -> int:
    if SPEC_JSON is None:
        die("this is the template; `repro report` writes a filled-in copy")
    spec = json.loads(SPEC_JSON)
    p = argparse.ArgumentParser(description=spec["title"])
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda", "xpu"])
    p.add_argument("--repair", action="append", nargs="?", const="default", default=[],
                   help="apply a repair (without NAME: " + (", ".join(spec["default_repairs"]) or "none known") + ")")
    p.add_argument("--no-hazard", action="store_true", help="run without the planted hazard (a control)")
    a = p.parse_args(argv)

    hazards = [] if a.no_hazard else list(spec["hazards"])
    repairs = set(spec["repairs"])
    for r in a.repair:
        if r == "default":
            if not spec["default_repairs"]:
                die("no repair is known for this divergence")
            repairs |= set(spec["default_repairs"])
        elif r not in spec["knobs"]["repairs"]:
            die(f"unknown repair {r!r} (known here: {', '.join(spec['knobs']['repairs'])})")
        elif spec["knobs"]["repairs"][r].get("piecewise_only") and MODES[spec["mode"]][0] == "full":
            die(f"repair {r}: a FULL decode graph holds the whole chain, so no family can run eagerly inside it")
        else:
            repairs.add(r)
    eager_opts, replay_opts = options_for(spec, hazards, sorted(repairs))
    device = pick_device(a.device)
    if device == "cpu" and spec["config"]["hidden"] <= 512:
        torch.set_num_threads(1)  # small matrices: threads only add start-up and contention
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    with torch.inference_mode():
        P = load_weights(spec, device)
        graphs = Graphs(device)
        eager_copy, replay_copy = LayerCopy(P, spec, eager_opts, device), LayerCopy(P, spec, replay_opts, device)
        eager = EagerRunner(eager_copy, eager_opts, spec.get("spec_tokens", 0))
        runner = GraphRunner(replay_copy, graphs, spec, replay_opts)
        w = spec["weights"]
        print(f"torch {torch.__version__} on {device_name(device)}; graphs: {graphs.api}")
        print(f"mode {spec['mode']}; hazard {', '.join(hazards) or 'none'}; "
              f"repair {', '.join(sorted(repairs)) or 'none'}; "
              f"weights " + (f"regenerated from seed {w['seed']}" if w["source"] == "seed" else f"from {w['file']}"))
        prev = None
        for st in spec["steps"]:
            e = eager.step(st)
            try:
                r = runner.step(st)
            except ReplayRefused as err:
                print(f"REFUSED: {err}")
                print("RESULT " + json.dumps({"diverged": False, "refused": True, "step": st["step"]}))
                return 1
            graphs.synchronize()
            div = first_difference(st, e, r, eager_copy, replay_copy)
            if div is not None:
                print(f"REPRODUCED: replay diverges from eager at {describe(div)}")
                n = len(st["token_ids"])
                runtime, size, _ = runner.last
                pads = runner.pad_rows(st)
                if st.get("dummy"):
                    print(f"  this step: a dummy step (an idle data-parallel rank's `_dummy_run`), {runtime} at "
                          f"{size} tokens over state indices {pads[1] if pads else []}; the eager copy runs nothing")
                else:
                    print(f"  this step: requests {st['request_ids']} slots {st['slots']} "
                          f"query_lens {st['query_lens']}"
                          + (f", {runtime} padded to {size}" if runtime else ", run eagerly (not graphed)")
                          + (f": padded rows' state indices {pads[1]}" if pads else "")
                          + (f", input ids {runner.input_ids[n:size].tolist()}" if runtime and size > n else ""))
                if prev is not None:
                    print(f"  previous step: requests {prev['request_ids']} slots {prev['slots']} "
                          f"query_lens {prev['query_lens']}")
                for note in runner.notes:
                    print(f"  note: {note}")
                if spec.get("expected"):
                    print(f"  the suite recorded: {describe(spec['expected'])}")
                print("RESULT " + json.dumps({"diverged": True, **div}))
                return 1
            prev = st
    print(f"not reproduced: replay == eager bit for bit over {len(spec['steps'])} steps")
    print("RESULT " + json.dumps({"diverged": False, "steps": len(spec["steps"])}))
    return 0


def pick_device(want):
    if want in ("auto", "cuda") and torch.cuda.is_available():
        return "cuda"
    if want in ("auto", "xpu"):
        xpu = getattr(torch, "xpu", None)
        if xpu is None or not xpu.is_available():
            try:  # older stacks register the XPU device through IPEX
                import intel_extension_for_pytorch  # registers the XPU device
            except ImportError:
                pass
            xpu = getattr(torch, "xpu", None)
        if xpu is not None and xpu.is_available():
            return "xpu"
    if want in ("auto", "cpu"):
        return "cpu"
    die(f"--device {want}: not available here")


def device_name(device):
    if device == "cuda":
        return torch.cuda.get_device_name()
    if device == "xpu":
        return torch.xpu.get_device_name()
    return "cpu"


if __name__ == "__main__":
    sys.exit(main())
