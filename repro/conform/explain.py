"""The differences between the mirror and vLLM that are deliberate, each with why it cannot change a
verdict (a field nothing reads in that state, or what vLLM would refuse to run); `docs/conformance.md`
lists them from here. Any other difference is unexplained and fails a conformance run."""
from __future__ import annotations

EXPLAINED = {
    "padded decode tokens": (
        "With no prefill in the batch vLLM's `split_decodes_and_prefills` returns every row, padding included, "
        "as a decode and the padded token count as `num_decode_tokens`; the mirror counts the live tokens. Both GDN "
        "layers read `num_decode_tokens` only to split decodes from prefills (vLLM's `_forward_core`: "
        "`split_non_spec`, prefills and decodes both present; the mirror's `_non_spec`: `num_prefills > 0`), so "
        "the value is never read where the two differ."),
    "has_initial_state without prefills": (
        "vLLM builds `has_initial_state` only when the batch has a prefill; the mirror always does. Both layers "
        "read it only for prefills (the varlen conv and chunked recurrence)."),
    "padding counted as prefills": (
        "vLLM 0.26.0's `split_decodes_and_prefills` counts a FULL step's zero-length padding rows (and their padded "
        "tokens) as prefills when the batch holds a prefill; 0.33.0 and the mirror leave them out. Padding rows exist "
        "only under a FULL dispatch, whose replay runs the graph captured for decodes over the persistent buffers, "
        "which a batch with a prefill does not stage: no count of this build is read."),
    "token indices of an unmixed batch": (
        "`spec_token_indx` / `non_spec_token_indx` gather each part's tokens in a batch that mixes spec rows with "
        "others; in a batch of spec rows alone vLLM stages an `arange` and an empty tensor into its buffers and the "
        "mirror builds none. Neither layer reads them unless the batch is mixed (vLLM: `num_prefills == 0 and "
        "num_decodes == 0` takes the whole batch; the mirror: `GDNMeta.mixed`)."),
    "pool size": (
        "With a block size the mirror's state-block pool holds `num_slots` request slots of blocks (what a layer "
        "copy's state cache holds) and hands out the least recently freed first, so it evicts a cached block "
        "sooner than a deployment's pool and misses a prefix hit vLLM finds; with a pool as large as vLLM's it "
        "schedules the same steps (the scheduler family compares that run). A missed hit makes a request recompute "
        "a prefix it could have started from a cached state: a schedule vLLM makes too, with fewer free blocks."),
}


# Explanations of one release's behaviour only (a run of another release meets none of them).
ONLY_IN = {"padding counted as prefills": "0.26.0", "pool size": "0.33.0"}


def builder_difference(theirs_meta, common):
    """The explanation of a builder field's difference after vLLM returned `theirs_meta` for the
    mirror's `Common` `common`, or None."""
    mixed = theirs_meta.num_spec_decodes > 0 and (theirs_meta.num_decodes + theirs_meta.num_prefills) > 0
    padded = len(common.query_lens) > 0 and common.query_lens[-1] == 0

    def explain(name, vllm, mirror):
        if name == "num_decode_tokens" and theirs_meta.num_prefills == 0:
            return "padded decode tokens"
        if name == "has_initial_state" and vllm is None and theirs_meta.num_prefills == 0:
            return "has_initial_state without prefills"
        if name in ("num_prefills", "num_prefill_tokens") and padded and theirs_meta.num_prefills > 0:
            return "padding counted as prefills"
        if name in ("spec_token_indx", "non_spec_token_indx") and not mixed:
            return "token indices of an unmixed batch"
        return None
    return explain

# Rules checked by reading the release's source, not by running it here: (vLLM's function, why).
NOT_RUN = {
    "dummy run": ("v1/worker/gpu_model_runner.py: GPUModelRunner._dummy_run",
                  "the runner cannot be built without a GPU (it makes CUDA streams); the calls it makes are run: its "
                  "capture build over the committed rows in `gdn builder`, its commit in `input batch`, each made where "
                  "the profile's `dummy_commits_block_table` and `dummy_restages` say. Read, not mirrored, and able to "
                  "change a verdict (a hazard candidate): 0.33.0's `_build_attention_metadata` takes `is_prefilling` "
                  "of a dummy run's rows from the batch's arrays, which keep the last occupant's counts; at K = 0 a "
                  "row whose last request left in its prompt (preempted, or aborted) makes the re-staging capture "
                  "build class the dummy row a prefill (`no_prior_state`), so it stages nothing and the FULL dummy "
                  "replay reads the previous batch's indices (vLLM #49757's mechanism, through its fix; run on 0.33.0's "
                  "builder: `num_prefills` 1, the buffer kept). The mirror's dummy build ignores `is_prefilling`."),
    "replay assertion": ("v1/worker/gpu_model_runner.py: GPUModelRunner.execute_model",
                         "needs a built runner; neither release asserts (the profiles' `assert_full_past_prompt`)"),
    "update order": ("v1/worker/gpu_model_runner.py: GPUModelRunner._update_states",
                     "needs a built runner; `input batch` makes its calls on vLLM's InputBatch in its order (removals, "
                     "then new requests, then resumed ones, then condense) and compares the mirror's `update`"),
    "align row growth": ("v1/worker/gpu_model_runner.py: GPUModelRunner._update_states (BlockTable.append_row)",
                         "a growing row is appended from the scheduler's new blocks, which the mirror's scheduler "
                         "writes whole; the columns the builder reads (from the running column on) are compared in "
                         "`gdn builder` with a block size"),
}

START_VALUES = (
    "vLLM allocates the builder's persistent buffers with `torch.empty`; the mirror with zeros (accepted counts with "
    "ones), so a run is a pure function of its seed. An uninitialised buffer read by a FULL replay would be a "
    "mechanism of this bug class, so the run measures it: it poisons vLLM's buffers after construction and counts "
    "every FULL replay whose rows vLLM had never written (`FULL replays of unwritten rows` above; a count above 0 "
    "fails the run, as a difference does). The capture build writes every row a FULL key reads, and the replays of "
    "that key read no other rows, so the start value is never what a replay reads.")
