"""Each decision vLLM's own code makes for a request stream, step by step, with the function that
made it: what an upstream report shows (`repro.report.upstream`) and what its script checks.

`decisions(paths, batches, ...)` drives a replay copy's path (`v1.V1Path` or `v2.V2Path`, as
`GraphRunner` drives it, FULL keys captured when first dispatched) over the steps and records, per
step: the scheduler's chunk for each request (its query, computed tokens, prompt and prefill
length), the uniform-decode decision and the graph key, the GDN builder's branch (its counts), and
for a FULL step whether the builder staged this step's rows into the persistent buffers the FULL
graph reads. A FULL step it did not stage is inconsistent: the replay reads the rows an earlier
step (or the capture) left there, and the GDN kernels skip or misdirect the state writes
(vLLM #53051's mechanism).
"""
from __future__ import annotations

from ..errors import ReplayRefused
from ..knobs.modes import Runtime

# The vLLM function behind each decision, by runner.
FUNCTIONS = {
    "v1": {"schedule": "vllm/v1/core/sched/scheduler.py: Scheduler.schedule (a preempted request, "
                       "`_preempt_request`: num_computed_tokens = 0, resumes with num_tokens - num_computed_tokens in "
                       "chunks the budget caps)",
           "uniform": "vllm/v1/worker/gpu_model_runner.py: GPUModelRunner._is_uniform_decode, called by "
                      "_determine_batch_execution_and_padding",
           "dispatch": "vllm/v1/cudagraph_dispatcher.py: CudagraphDispatcher.dispatch",
           "builder": "vllm/v1/attention/backends/gdn_attn.py: GDNAttentionMetadataBuilder.build "
                      "(num_decode_draft_tokens from GPUModelRunner._prepare_inputs)",
           "staging": "GDNAttentionMetadataBuilder._stage_spec_decode / _stage_decode (num_prefills == 0)"},
    "v2": {"schedule": "vllm/v1/core/sched/scheduler.py: Scheduler.schedule (a resumed request is re-sent with its "
                       "kept tokens as prefill: NewRequestData.prefill_token_ids)",
           "uniform": "vllm/v1/worker/gpu/model_runner.py: GPUModelRunner.gather_batch_req_state "
                      "(decode_graph_eligible), vllm/v1/worker/utils.py: get_uniform_decode_token_count",
           "dispatch": "vllm/v1/worker/gpu/cudagraph_utils.py: CudaGraphManager.dispatch (dp_utils.dispatch_cg_and_sync_dp)",
           "builder": "vllm/v1/worker/gpu/model_states/mamba_hybrid.py: MambaHybridModelState.prepare_attn, "
                      "GDNAttentionMetadataBuilder.build",
           "staging": "GDNAttentionMetadataBuilder._stage_spec_decode / _stage_decode (num_prefills == 0)"},
}


def _shares(t, buf) -> bool:
    return t is not None and t.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()


def step_entry(b) -> dict:
    """The scheduler's side of step `b`: each request's chunk."""
    return {"step": b.step, "dummy": b.dummy,
            "requests": [{"rid": r, "query": q, "computed": c, "prompt": p, "prefill": f, "drafts": d,
                          "phase": ("decode" if c >= f else "recompute past its prompt" if c >= p else "prompt"),
                          "blocks": [int(x) for x in blocks]}
                         for r, q, c, p, f, d, blocks in zip(b.request_ids, b.query_lens, b.computed(), b.prompts(),
                                                             b.prefills(), b.drafts(), b.block_rows())]}


def decisions(path, batches) -> list[dict]:
    """The decision trace of `batches` on a replay copy's `path` (module docstring)."""
    out, captured = [], set()
    builder = path.builder.builder
    k = builder.num_spec
    buf = builder.spec_state_indices_tensor if k else builder.non_spec_state_indices_tensor
    for b in batches:
        e = step_entry(b)
        out.append(e)
        path.update(b)
        try:
            runtime, desc = path.dispatch(b)
        except ReplayRefused as r:
            e.update(refused=str(r), consistent=True)
            break
        e.update(runtime=runtime.name, key=str(desc), uniform=desc.uniform)
        if runtime is Runtime.FULL and desc not in captured:  # captured as a runner captures: null rows
            captured.add(desc)
            path.capture_metadata(desc)
        if b.dummy:
            if runtime is Runtime.FULL:
                path.dummy(desc)
            e["consistent"] = True
            continue
        meta = path.metadata(b, runtime, desc)
        ours = meta.spec_state_indices if k else meta.non_spec_state_indices
        staged = _shares(ours, buf)
        e.update(builder={"num_decodes": meta.num_decodes, "num_prefills": meta.num_prefills,
                          "num_spec_decodes": meta.num_spec_decodes}, staged=staged)
        if runtime is Runtime.FULL:
            own = meta.spec_state_indices if meta.num_spec_decodes else meta.non_spec_state_indices
            e["graph_reads"] = buf[:desc.num_reqs].tolist()  # the persistent rows the FULL graph reads
            e["own_rows"] = own.tolist()  # the rows this step's requests hold
            e["consistent"] = staged
        else:
            e["consistent"] = True
    return out


def first_inconsistent(trace: list[dict]) -> dict | None:
    return next((e for e in trace if not e.get("consistent", True)), None)
