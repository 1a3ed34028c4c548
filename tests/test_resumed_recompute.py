"""A finding of this suite's soak, not yet in the public record: vLLM PR #53059's uniform-decode
check (`num_computed_tokens >= num_prompt_tokens`) lets a preempted request's recompute through.
The recompute covers the prompt and every token sampled before the preemption; its last chunk can be
exactly 1+K tokens, all past the prompt, so the batch is called a uniform decode and replays the
FULL graph, while the GDN builder takes its prefill branch and stages nothing: the replay reads
stale state indices (vLLM #53051's mechanism). The V2 runner's form (vLLM PR #51865) counts the
recompute (`prefill_len`), and the fixed stack uses it. The stream is the smallest in which vLLM
0.33.0's own V1 scheduler makes that chunk (`tests/test_vllm_schedule.py` runs it)."""
from repro.graphs import make_provider
from repro.islands import Model
from repro.job.cases import Case, run_case
from repro.scheduler.sequence import Request, Sequence

# One request, prompt 2, K = 2, a step budget of 3: its first decode keeps its 3 tokens, then it is
# preempted; the recompute (prompt, first sampled token, the 3 kept: 6 tokens) runs in chunks of 3
# and 3, the last at step 3, past the prompt.
TAIL = 3
REQUESTS = [Request(0, 2, 2, preempt_after=1)]


def _sequence() -> Sequence:
    return Sequence(REQUESTS, num_slots=1, max_tokens=3, vocab=512, seed=0, spec_tokens=2)


def test_the_sequence_ends_in_a_recompute_chunk_of_1_plus_k_past_the_prompt():
    last = _sequence().batches()[TAIL]
    assert (last.request_ids, last.query_lens, last.drafts()) == ([0], [3], [0])
    assert last.computed()[0] >= last.prompts()[0] and last.computed()[0] < last.prefills()[0]


def test_53059s_form_replays_it_through_the_stale_full_graph_and_the_fixed_stack_does_not(device, tiny_path):
    model, provider = Model(tiny_path, device), make_provider(device)
    seq = _sequence()
    fixed = run_case(model, provider, Case("chain", "full_and_piecewise", spec_tokens=2), seq)
    assert not fixed.detected, fixed.failure
    for repair in ("past-prompt-uniform", "no-hybrid-prefill"):
        hole = run_case(model, provider, Case("chain", "full_and_piecewise", ("shape-only-uniform-decode",), (repair,),
                                              spec_tokens=2), seq)
        assert hole.detected and hole.failure.step == TAIL, (repair, hole.failure)
