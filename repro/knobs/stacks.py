"""Stack profiles: every control rule as one real serving stack has it, read from that release's
source (a table of rule settings, not code paths: `ControlRules` is what the runner reads).

`--stack NAME` on `run`, `hunt`, `report` and `bench` starts every case from the profile's rules;
a case's hazards and repairs then change them as they change the fixed defaults. What a profile
says a stack is exposed to is what a hunt on it finds.

The vLLM sources are the wheels on PyPI (`pip download --no-deps vllm==X`), paths relative to the
`vllm/` package. The V1 model runner (MRV1) is what 0.26.0 runs for hybrid models such as
Qwen3.5/3.6 (`config/vllm.py: _is_default_v2_model_runner_model` returns False for them) and what
0.33.0 runs with `VLLM_USE_V2_MODEL_RUNNER=0` (its default is the V2 runner, `vllm-0.33-mrv2`, whose
rules the fixed stack takes, with vLLM PR #55123's assertion added). The XPU runner
(`v1/worker/xpu_model_runner.py: XPUModelRunner`) subclasses it in both releases and overrides
none of these rules, so each profile holds for XPU as for CUDA; 0.26.0 also needs
`VLLM_XPU_ENABLE_XPU_GRAPH=1` for XPU graphs at all (`platforms/xpu.py: check_and_update_config`).

A profile's `modes` are the graph modes its release runs this model in, the default first: a blind
hunt of the profile searches each (`repro.search.blind`).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ..errors import BadInput
from .options import ControlRules, FirstChunk, UniformDecode


@dataclass(frozen=True)
class Stack:
    name: str
    what: str
    rules: ControlRules
    sources: dict  # rule -> where the setting was read ("file: function (line)")
    modes: tuple[str, ...] = ()  # the graph modes it runs this model in, its default first (`MODES`)


# Every profile's modes (read from vLLM 0.33.0): FULL_AND_PIECEWISE is the default (`config/vllm.py:
# OPTIMIZATION_LEVEL_02` and `_03` set `cudagraph_mode` to it; a requested FULL also becomes it for
# GDN's UNIFORM_BATCH support with the attention ops as splitting ops: `config/compilation.py:
# CompilationConfig.resolve_cudagraph_mode_and_sizes`); PIECEWISE is what the lab's B70 runs used;
# FULL_DECODE_ONLY is what that resolution gives when the attention ops are not splitting ops (its
# other branch), and what a user sets for decode-only graphs. NONE replays nothing to compare.
MODES = ("full_and_piecewise", "piecewise", "full_decode_only")

_FIXES = {
    "uniform_decode": "vLLM PR #51865 (the V2 runner's `gather_batch_req_state`): no uniform decode while a request "
                      "is in its prefill phase, a resumed request's recompute included (PR #53059's past-prompt "
                      "check misses that recompute)",
    "assert_full_past_prompt": "vLLM PR #55123: `execute_model` asserts a FULL dispatch has no request in its prompt",
    "first_chunk": "vLLM #51565: `GDNAttentionMetadataBuilder.build` classes a first chunk by `is_prefilling`",
    "clear_finished_row": "vLLM #37728: `InputBatch.remove_request` calls `BlockTable.clear_row`",
    "dummy_commits_block_table": "vLLM #37728: `_dummy_run` commits the block table for its padded rows",
    "move_row_zeroes_source": "vLLM #49757: `BlockTable.move_row` zeroes the row it moved",
    "dummy_restages": "vLLM #49757: a FULL `_dummy_run` builds its metadata as for capture",
    "zero_draft_spec_row": "`GPUModelRunner._prepare_inputs` counts a one-token row past its prompt with no drafts as "
                           "a spec row (0 drafts), so the GDN builder applies its accepted offset (vLLM 0.33.0)",
    "decode_capture_sizes": "`VllmConfig._set_cudagraph_sizes` adds the uniform-decode sizes n*(1+K) to the default "
                            "capture list (vLLM 0.33.0)",
}

_V033 = "vllm 0.33.0: "
_V026 = "vllm 0.26.0: "
_MRV2 = "vllm 0.33.0 (the V2 runner): "

# The V2 model runner (`v1/worker/gpu/`), its rules in the V1 runner's terms the runner mirrors: it
# keeps no persistent batch of rows (requests keep their state index, block-table rows are gathered
# each step), so the block-table rules hold by construction. Its decisions run through vLLM's own
# code with `--control vllm-v2` (`repro/upstream/v2.py`), and the conformance tests hold its
# uniform-decode decision against the phase-aware rule.
MRV2 = Stack(
    "vllm-0.33-mrv2", "vLLM 0.33.0, the V2 model runner (its default where Triton is present; 0.34.0's only runner)",
    ControlRules(uniform_decode=UniformDecode.PHASE_AWARE, assert_full_past_prompt=False,
                 first_chunk=FirstChunk.IS_PREFILLING, clear_finished_row=True, dummy_commits_block_table=True,
                 move_row_zeroes_source=True, dummy_restages=True, zero_draft_spec_row=True, decode_capture_sizes=True),
    {"uniform_decode": _MRV2 + "v1/worker/gpu/model_runner.py: GPUModelRunner.gather_batch_req_state (1306): "
                       "decode_graph_eligible, a request in its prefill phase until it computed its prefill_len",
     "assert_full_past_prompt": _MRV2 + "v1/worker/gpu/model_runner.py: GPUModelRunner.execute_model (1764): no "
                                "check of a FULL dispatch",
     "first_chunk": _MRV2 + "v1/attention/backends/gdn_attn.py: GDNAttentionMetadataBuilder.build (373): "
                    "no_prior_state & is_prefilling, the prefill phase from model_states/mamba_hybrid.py: prepare_attn",
     "clear_finished_row": _MRV2 + "v1/worker/gpu/block_table.py: BlockTables.gather_block_tables (160): rows are "
                           "gathered per request each step, padded rows zeroed",
     "dummy_commits_block_table": _MRV2 + "v1/worker/gpu/model_runner.py: GPUModelRunner.prepare_dummy_attn (1617): "
                                  "get_dummy_block_tables zeroes a dummy run's rows (the null block)",
     "move_row_zeroes_source": _MRV2 + "v1/worker/gpu/states.py: RequestState.add_request: a request keeps its index "
                               "(no condense moves a row)",
     "dummy_restages": _MRV2 + "v1/worker/gpu/model_runner.py: GPUModelRunner.execute_model (1764): a dummy run's "
                       "prepare_attn(for_capture=cg_mode == FULL)",
     "zero_draft_spec_row": _MRV2 + "v1/worker/gpu/model_states/mamba_hybrid.py: MambaHybridModelState.prepare_attn "
                            "(283): a decode row without drafts stays a spec row (num_decode_draft_tokens 0)",
     "decode_capture_sizes": _MRV2 + "config/vllm.py: VllmConfig._set_cudagraph_sizes (2541): uniform_decode_sizes, "
                             "the config both runners read"}, MODES)

# Every known fix: the V2 runner's rules, where they come from it, and vLLM PR #55123's assertion.
FIXED = Stack("fixed", "every known fix applied (the default): the V2 runner's rules and vLLM PR #55123's assertion",
              replace(MRV2.rules, assert_full_past_prompt=True),
              {r: (_FIXES[r] if r == "assert_full_past_prompt" else f"{_FIXES[r]}; as {MRV2.sources[r]}")
               for r in _FIXES}, MODES)

STACKS: dict[str, Stack] = {s.name: s for s in (
    FIXED,
    Stack("vllm-0.33-mrv1", "vLLM 0.33.0, the V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0), CUDA and XPU",
          ControlRules(uniform_decode=UniformDecode.SHAPE, assert_full_past_prompt=False,
                       first_chunk=FirstChunk.IS_PREFILLING, clear_finished_row=True, dummy_commits_block_table=True,
                       move_row_zeroes_source=True, dummy_restages=True, zero_draft_spec_row=True,
                       decode_capture_sizes=True),
          {"uniform_decode": _V033 + "v1/worker/gpu_model_runner.py: GPUModelRunner._is_uniform_decode (3620): "
                             "shape only",
           "assert_full_past_prompt": _V033 + "v1/worker/gpu_model_runner.py: GPUModelRunner.execute_model (3906): "
                                      "no check of a FULL dispatch",
           "first_chunk": _V033 + "v1/attention/backends/gdn_attn.py: GDNAttentionMetadataBuilder.build (373): "
                          "no_prior_state & is_prefilling",
           "clear_finished_row": _V033 + "v1/worker/gpu_input_batch.py: InputBatch.remove_request (541)",
           "dummy_commits_block_table": _V033 + "v1/worker/gpu_model_runner.py: GPUModelRunner._dummy_run (5687)",
           "move_row_zeroes_source": _V033 + "v1/worker/block_table.py: BlockTable.move_row (137-146)",
           "dummy_restages": _V033 + "v1/worker/gpu_model_runner.py: GPUModelRunner._dummy_run (5699): "
                             "for_cudagraph_capture when the mode is FULL",
           "zero_draft_spec_row": _V033 + "v1/worker/gpu_model_runner.py: GPUModelRunner._prepare_inputs (2220): "
                                  "zero_draft_decode_mask",
           "decode_capture_sizes": _V033 + "config/vllm.py: VllmConfig._set_cudagraph_sizes (2541): "
                                   "uniform_decode_sizes"}, MODES),
    Stack("vllm-0.26", "vLLM 0.26.0 (the XPU image's 0.26.1rc1 the B70 packet ran), the V1 model runner "
          "(the default for hybrid models there)",
          ControlRules(uniform_decode=UniformDecode.SHAPE, assert_full_past_prompt=False,
                       first_chunk=FirstChunk.QUERY_LEN, clear_finished_row=True, dummy_commits_block_table=True,
                       move_row_zeroes_source=False, dummy_restages=False, zero_draft_spec_row=False,
                       decode_capture_sizes=False),
          {"uniform_decode": _V026 + "v1/worker/gpu_model_runner.py: GPUModelRunner._is_uniform_decode (3857): "
                             "shape only",
           "assert_full_past_prompt": _V026 + "v1/worker/gpu_model_runner.py: GPUModelRunner.execute_model (4111): "
                                      "no check of a FULL dispatch",
           "first_chunk": _V026 + "v1/attention/backends/gdn_attn.py: GDNAttentionMetadataBuilder.build (213): "
                          "split_decodes_and_prefills(m, decode_threshold=1)",
           "clear_finished_row": _V026 + "v1/worker/gpu_input_batch.py: InputBatch.remove_request (531)",
           "dummy_commits_block_table": _V026 + "v1/worker/gpu_model_runner.py: GPUModelRunner._dummy_run (6001)",
           "move_row_zeroes_source": _V026 + "v1/worker/block_table.py: BlockTable.move_row (142-146): the vacated "
                                     "row is left as it was",
           "dummy_restages": _V026 + "v1/worker/gpu_model_runner.py: GPUModelRunner._dummy_run (6010): "
                             "for_cudagraph_capture=is_graph_capturing only",
           "zero_draft_spec_row": _V026 + "v1/worker/gpu_model_runner.py: GPUModelRunner._prepare_inputs (2226): "
                                  "a row is a spec row only when its query is its drafts plus one",
           "decode_capture_sizes": _V026 + "config/vllm.py: VllmConfig._set_cudagraph_sizes: the token grid "
                                   "and the step budget alone"}, MODES),
    MRV2,
)}

RULES = tuple(f.name for f in fields(ControlRules))

for _s in STACKS.values():  # every rule of every profile says where it was read
    assert set(_s.sources) == set(RULES), _s.name
assert FIXED.rules == ControlRules(), "the rules' defaults are the fixed stack's"


def stack(name: str) -> Stack:
    if name not in STACKS:
        raise BadInput(f"unknown stack {name!r} (choose from {', '.join(STACKS)})")
    return STACKS[name]


def differs(rules: ControlRules) -> list[str]:
    """The rules where `rules` is not the fixed form, in table order."""
    fixed = ControlRules()
    return [r for r in RULES if getattr(rules, r) != getattr(fixed, r)]
