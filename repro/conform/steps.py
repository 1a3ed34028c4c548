"""Two rules of the V1 runner on every step of drawn request sequences: the uniform-decode decision
(`repro.control.dispatch.uniform_decode` under the profile's rule against
`GPUModelRunner._is_uniform_decode`) and the draft bookkeeping (`repro.control.builder.draft_counts`
against the lines of `GPUModelRunner._prepare_inputs` that compute `num_decode_draft_tokens`,
`repro.upstream.runner`). Dummy steps carry no requests and are left out (`_dummy_run` forces the
flag and builds no draft counts)."""
from __future__ import annotations

from ..control.builder import draft_counts
from ..control.dispatch import prefilling, uniform_decode
from ..upstream import runner
from .result import RuleResult

RULES = {
    "uniform decode": ("v1/worker/gpu_model_runner.py: GPUModelRunner._is_uniform_decode",
                       "repro/control/dispatch.py: uniform_decode"),
    "draft bookkeeping": ("v1/worker/gpu_model_runner.py: GPUModelRunner._prepare_inputs (num_decode_draft_tokens)",
                          "repro/control/builder.py: draft_counts"),
}


def results() -> dict[str, RuleResult]:
    return {r: RuleResult(r, *RULES[r]) for r in RULES}


def describe(batch) -> str:
    """A step's inputs, spelled out."""
    return (f"step {batch.step} (query_lens {batch.query_lens}, computed {batch.computed()}, prompts {batch.prompts()}, "
            f"drafts {batch.drafts()})")


def compare_sequence(up, seq, rules, out: dict[str, RuleResult]) -> None:
    k = seq.spec_tokens
    for b in seq.batches():
        if b.dummy or not b.num_reqs:
            continue
        ours = uniform_decode(rules.uniform_decode, b.query_lens, prefilling(rules.uniform_decode, b), k)
        out["uniform decode"].compare(lambda: f"{describe(b)}, K={k}",
                                      {"uniform": (runner.uniform_decode(up, b.query_lens, k), ours)})
        if not k:  # the bookkeeping runs only with a speculative config
            continue
        theirs = runner.draft_counts(up, b.query_lens, b.drafts(), b.computed(), b.prompts())
        mine = draft_counts(b.query_lens, b.drafts(), b.computed(), b.prompts(), rules)
        out["draft bookkeeping"].compare(lambda: f"{describe(b)}, K={k}",
                                         {"num_decode_draft_tokens": (theirs.tolist(), mine.tolist())})


def run(up, seqs, rules) -> list[RuleResult]:
    out = results()
    for seq in seqs:
        compare_sequence(up, seq, rules, out)
    return list(out.values())
