"""A conformance run: every rule family of the mirror against the installed vLLM's code, under one
stack profile, over inputs drawn from the suite's strategies (`inputs`).

`conform(up, stack, budget, seed)` runs the five families and returns a `Conformance`:
- dispatch (`dispatch.py`): `budget.cases` runner configurations;
- steps (`steps.py`): the uniform-decode decision and the draft bookkeeping on every step;
- scheduler (`scheduler.py`): vLLM's V1 scheduler and the mirror's on the same request streams, step
  by step;
- builder (`builder.py`): the GDN builder on every build call of each sequence's control path;
- input batch (`input_batch.py`): every call on the persistent batch;
the steps, the scheduler and the builder over `budget.sequences` request sequences for each K in 0..3
with and without a block size (the builder's under the graph modes and capture lists in turn), the
input batch over three times as many for each K without a block size (a growing row is the runner's
`_update_states`, not run here; its calls are cheap, and the family needs as many calls as the
others). Against a release whose block-aligned scheduling and long-prefill threshold the mirror
does not follow (`scheduler.ALIGN_RELEASE`) the scheduler compares the streams without a block size, each with
the threshold off, the input batch's among them, so that it too makes 10,000 calls.

`CLAIMS` is the release each profile says it is; the `fixed` profile's rules come from vLLM's V2
runner and its fix PRs, which need Triton and a GPU (the V2 runner is not importable without
Triton): it is read, not measured, here.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..knobs.stacks import Stack
from ..upstream.case import Case
from . import builder, dispatch, input_batch, scheduler, steps
from .budget import Budget
from .inputs import cases_st, draw, sequences_st

CLAIMS = {"vllm-0.33-mrv1": "0.33.0", "vllm-0.26": "0.26.0"}
MODES = ("full_and_piecewise", "full_decode_only", "piecewise", "full")
SIZES = ((1, 2, 4, 8), None, (1, 2, 3, 4, 6, 9), (2, 4, 8, 16))
COMBOS = tuple((k, bs) for k in (0, 1, 2, 3) for bs in (None, 4, 8) if bs is None or bs > k)


@dataclass
class Conformance:
    version: str
    stack: str
    claimed: str | None  # the release the profile says it is (None: none)
    seed: int
    budget: Budget
    results: list = field(default_factory=list)  # RuleResult, family by family
    family: dict = field(default_factory=dict)  # rule -> its family
    seconds: dict = field(default_factory=dict)  # family -> wall seconds
    unwritten_replays: int = 0  # FULL replays of rows vLLM's buffers never wrote (see builder.py)

    @property
    def differences(self) -> int:
        """Unexplained differences, and FULL replays of rows vLLM never wrote (each fails a run)."""
        return sum(r.unexplained for r in self.results) + self.unwritten_replays

    def calls(self, family: str) -> int:
        return sum(r.calls for r in self.results if self.family[r.rule] == family)

    def to_json(self) -> dict:
        return {"vllm": self.version, "stack": self.stack, "claimed": self.claimed, "seed": self.seed,
                "budget": {"cases": self.budget.cases, "sequences": self.budget.sequences},
                "differences": self.differences, "unwritten_replays": self.unwritten_replays,
                "families": {f: {"calls": self.calls(f), "seconds": round(s, 1)} for f, s in self.seconds.items()},
                "rules": [{"family": self.family[r.rule], **r.to_json()} for r in self.results]}


def builder_pairs(seqs_by_combo, cache: Path | None = None) -> list:
    """(case, sequence) for the builder: each sequence's runner as the hunt's, the modes and capture
    lists in turn (some below 1+K times the requests, so the staging limit binds)."""
    pairs = []
    for (k, bs), seqs in seqs_by_combo.items():
        for i, s in enumerate(seqs):
            pairs.append((Case(mode=MODES[i % len(MODES)], spec_tokens=k, sizes=SIZES[(i // len(MODES)) % len(SIZES)],
                               max_num_seqs=s.num_slots, max_num_batched_tokens=s.max_tokens, block_size=bs,
                               cache=cache), s))
    return pairs


def conform(up, stack: Stack, budget: Budget = Budget(), seed: int = 0, note=None,
            cache: Path | None = None) -> Conformance:
    """Every family under `stack`'s rules against `up` (`repro.upstream.load.load()`); `note(text)`
    hears each family's end; `cache` holds the embedded checkpoint every case's config reads."""
    out = Conformance(up.version, stack.name, CLAIMS.get(stack.name), seed, budget)
    rules = stack.rules

    def family(name, results, t0):
        out.results += results
        out.family.update({r.rule: name for r in results})
        out.seconds[name] = time.monotonic() - t0
        if note:
            note(f"{name}: {sum(r.calls for r in results)} calls, {sum(r.unexplained for r in results)} differences, "
                 f"{out.seconds[name]:.0f} s")

    t0 = time.monotonic()
    family("dispatch", dispatch.run(up, [replace(c, cache=cache) for c in draw(cases_st(), budget.cases, seed)], rules),
           t0)
    seqs = {(k, bs): draw(sequences_st(k, bs, data_parallel=True), budget.sequences, seed + 10 * k + (bs or 0))
            for k, bs in COMBOS}
    t0 = time.monotonic()
    family("steps", steps.run(up, [s for ss in seqs.values() for s in ss], rules), t0)
    plain = [(Case(spec_tokens=k, max_num_seqs=s.num_slots, max_num_batched_tokens=s.max_tokens, cache=cache), s)
             for k in (0, 1, 2, 3) for s in draw(sequences_st(k, None, data_parallel=True), 3 * budget.sequences,
                                                 seed + 100 + k)]
    t0 = time.monotonic()
    # against a release whose block-aligned scheduling the mirror does not follow, the streams without a
    # block size are all the scheduler family compares: it takes the input batch's too
    streams = [s for ss in seqs.values() for s in ss]
    if up.version != scheduler.ALIGN_RELEASE:
        streams += [s for _, s in plain]
    family("scheduler", scheduler.run(up, streams, rules, cache), t0)
    t0 = time.monotonic()
    results, out.unwritten_replays = builder.run(up, builder_pairs(seqs, cache), rules)
    family("builder", results, t0)
    t0 = time.monotonic()
    family("input batch", input_batch.run(up, plain, rules), t0)
    return out
