"""The main job: every island at baseline, then each hazard alone, with and without its repair,
over one seeded request sequence, on one provider. Results follow DESIGN.md's JSON contract;
`Case`, `CaseResult`, `verdict`, `format_table`, `exit_code` and `device_name` live in `results.py`,
shared with the multi-rank runs of `comm/`."""
from __future__ import annotations

from dataclasses import replace

from ..knobs import hazards as hz
from ..control.dispatch import DEFAULT_SIZES
from ..control.modes import DEFAULT_MODES, mode_name
from ..errors import BadInput
from ..islands import Model, Runs, kind
from ..lockstep import run_lockstep, run_moe_lockstep
from ..check.reference_copy import ReferenceCopy, default_every, independent_copy
from .results import Case, CaseResult
from ..scheduler.sequence import Sequence, random_sequence

# What a default run covers: the chain, each chain island isolated, and the moe island alone.
DEFAULT_ISLANDS = ("chain", "submod0", "submod1", "gdn_core", "moe")


def plan(island: str, mode: str | None, hazards, repairs, streams: bool) -> list[Case]:
    """Explicit hazards/repairs -> one case per mode; none -> baseline plus every applicable hazard."""
    whole = island in ("all", None)
    islands = (["chain"] if (hazards or repairs) else list(DEFAULT_ISLANDS)) if whole else [island]
    modes = [mode_name(mode)] if mode else list(DEFAULT_MODES)
    cases: list[Case] = []
    for isl in islands:
        k = kind(isl)
        if k.runs is Runs.RANKS:
            raise BadInput(f"{isl} needs ranks: use `repro run --island {isl} --tp N`")
        for m in [mode_name(k.mode)] if k.mode else modes:
            if hazards or repairs:
                hz.check(hazards, repairs, m, streams, "chain" if k.runs is Runs.CHAIN else isl)
                cases.append(Case(isl, m, tuple(hazards), tuple(repairs), hz.expectation(hazards, repairs)))
            else:
                cases.append(Case(isl, m))
    if hazards or repairs or not (whole or island == "chain"):
        return cases
    for m in modes:
        for h in hz.planted(m, streams):
            cases.append(Case("chain", m, (h.name,), (), hz.expectation((h.name,), ())))
            if h.repairs:
                cases.append(Case("chain", m, (h.name,), (h.repairs[0],), "clean"))
    return cases


def run_case(model: Model, provider, case: Case, seq: Sequence, sentinel: int = 0, sizes=DEFAULT_SIZES,
             trace=None, progress=None, strict: bool = False, amplify: bool = True,
             reference_every: int | None = None) -> CaseResult:
    """One case in lockstep. `strict`: batch variance and nondeterminism fail the case as well.
    `amplify` False: stream races are left to their natural timing (`race.py`). `reference_every`:
    run the independent reference copy every N steps (0: never; None: `reference_copy.default_every`)."""
    opts = hz.options_for(case.hazards, case.repairs)
    if not amplify:
        opts = replace(opts, runner=replace(opts.runner, amplify=False))
    k = kind(case.island)
    opts = replace(opts, runner=replace(opts.runner, eager_families=opts.runner.eager_families | k.eager))
    copy_sentinel = opts.sentinel(sentinel)  # a hazard may give the kernels another sentinel
    if k.runs is Runs.ALONE:
        res = run_moe_lockstep(model, provider, seq.batches(), sizes=sizes)
    else:
        usable = None if copy_sentinel == 0 else range(seq.num_slots)
        batches = seq.batches(usable)
        every = default_every(provider.device) if reference_every is None else reference_every
        spec = getattr(seq, "spec_tokens", 0)
        ref = ReferenceCopy(independent_copy(model, seq.num_slots, copy_sentinel, spec), every) if every > 0 else None
        res = run_lockstep(lambda o: model.copy(o, num_slots=seq.num_slots, sentinel=copy_sentinel, spec_tokens=spec),
                           provider, batches, mode=case.mode, opts=opts, sizes=sizes, trace=trace, progress=progress,
                           max_tokens=seq.max_tokens, reference=ref, max_num_seqs=seq.num_slots)
    return CaseResult(case, res.steps, res.divergence, [f.to_json() for f in res.findings], res.eager_us,
                      res.replay_us, res.kernel_findings, strict, bound_usage=res.bound_usage)


def default_sequence(seed: int, steps: int, num_slots: int = 8, vocab: int = 512) -> Sequence:
    """A seeded random sequence cut to exactly `steps` scheduler steps."""
    n = max(2, steps // 6)
    while True:
        seq = random_sequence(seed, num_requests=n, num_slots=num_slots, vocab=vocab)
        batches = seq.batches()
        if len(batches) >= steps:
            seq.max_steps = steps
            return seq
        n = n * 3 // 2 + 1

