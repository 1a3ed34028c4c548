"""The main job: every island at baseline, then each hazard alone, with and without its repair,
over one seeded request sequence, on one provider. Results follow DESIGN.md's JSON contract;
`Case`, `CaseResult`, `verdict`, `format_table`, `exit_code` and `device_name` live in `results.py`,
shared with the multi-rank runs of `comm/`."""
from __future__ import annotations

import itertools
import random
from dataclasses import replace

from kernels.errors import KernelRefused
from kernels.gdn import fused

from ..knobs import hazards as hz
from ..knobs.control import Control, decided_by_vllm
from ..control.dispatch import DEFAULT_SIZES, default_capture_sizes
from ..knobs.modes import DEFAULT_MODES, mode_name
from ..errors import BadInput, Refused
from ..islands import Model, Runs, kind
from ..lockstep import run_lockstep, run_moe_lockstep
from ..check.reference_copy import ReferenceCopy, default_every, independent_copy
from ..capture.control import paths_for
from .results import Case, CaseResult
from .steps import case_steps, copy_slots
from .triggers import reached
from ..scheduler.sequence import Request, Sequence
from ..control.shape import StepShape, decode_len

# What a default run covers: the chain, each chain island isolated, and the moe island alone.
DEFAULT_ISLANDS = ("chain", "submod0", "submod1", "gdn_core", "moe")


def check_knobs(hazards, repairs) -> None:
    """Each hazard and repair once: a second `--hazard X` would be silently the same run."""
    for what, names in (("--hazard", hazards), ("--repair", repairs)):
        twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if twice is not None:
            raise BadInput(f"{what} {twice} is given twice (each hazard and repair is planted once)")


DEFAULT_SPEC = 2  # the default plan's spec-decode rows: K = 2, as the record's #53051 packet ran (MTP, k = 2)


def sequence_needs(hazards, spec_tokens: int | None) -> tuple[int, bool]:
    """(K, data_parallel) of a case's sequence: `spec_tokens` when given, else the hazards' own K
    (a hazard of 1+K-token dispatch needs drafts); dummy steps when a hazard needs an idle rank's."""
    hs = [hz.HAZARDS[h] for h in hazards if h in hz.HAZARDS]
    k = spec_tokens if spec_tokens is not None else max((h.spec_tokens for h in hs), default=0)
    return k, any(h.data_parallel for h in hs)


def check_island_knobs(isl: str, mode: str, hazards, repairs, streams: bool, chosen: str | None = None) -> None:
    """Refuse what island `isl` cannot show in `mode`: a hazard of another island, one that acts in a
    piece the island runs eagerly, one whose graphs the mode lacks (named as the island's own mode
    when the island has one), and (`chosen`: the --mode asked for) another mode than the one an
    isolated island is checked in."""
    k = kind(isl)
    if chosen and k.mode and mode_name(chosen) != mode_name(k.mode):
        raise Refused(f"--mode {mode_name(chosen)}: island {isl} is checked in {mode_name(k.mode)} mode only "
                      "(leave --mode out, or run the chain in that mode: --island chain)")
    if hazards or repairs:
        where = f"island {isl}'s {mode_name(k.mode)} mode" if k.mode else None
        hz.check(hazards, repairs, mode, streams, isl, k.eager, where)


def plan(island: str, mode: str | None, hazards, repairs, streams: bool, spec_tokens: int | None = None,
         stack: str = "fixed", block_size: int | None = None, control: Control = Control(),
         baseline: bool = False) -> list[Case]:
    """Explicit hazards/repairs -> one case per mode; none -> baseline plus every applicable hazard,
    and the chain's baseline again with K = DEFAULT_SPEC draft tokens a decode in each mode with a
    FULL decode graph (`baseline`: the baseline rows only). `spec_tokens` given: every case runs at
    that K. Each hazard case runs the sequence its hazard needs (`sequence_needs`); every case starts
    from `stack`'s rules. With a `block_size` (prefix caching) every case runs with it and the
    default plan leaves out the rows whose K is not below it (a block is wider than a decode's
    drafts: `check_block_size`). An island named alone is refused a mode or knob it cannot show
    (`check_island_knobs`). Under a vLLM `control` every case runs vLLM's decisions, and the default
    plan leaves out the hazards whose mechanism vLLM's code decides (`knobs.control.decided_by_vllm`:
    plant those with a patch). Under a fused GDN core (`kernels.gdn.fused`) a hazard whose
    configuration it refuses (`Hazard.fused_refused`) is expected to be refused, with its repairs."""
    whole = island in ("all", None)
    islands = (["chain"] if (hazards or repairs) else list(DEFAULT_ISLANDS)) if whole else [island]
    modes = [mode_name(mode)] if mode else list(DEFAULT_MODES)
    base_k = spec_tokens or 0

    def case(isl, m, hs=(), rs=(), expect="clean"):
        k, dp = sequence_needs(hs, spec_tokens)
        if fused() and any(hz.HAZARDS[h].fused_refused for h in hs):
            expect = "refused"  # the fused GDN core cannot say what the hazard's configuration does
        return Case(isl, m, tuple(hs), tuple(rs), expect, k, dp, stack, block_size, control)

    cases: list[Case] = []
    for isl in islands:
        k = kind(isl)
        if k.runs is Runs.RANKS:
            raise BadInput(f"{isl} needs ranks: use `repro run --island {isl} --tp N`")
        for m in [mode_name(k.mode)] if k.mode else modes:
            check_island_knobs(isl, m, hazards, repairs, streams, None if whole else mode)
            if hazards or repairs:
                cases.append(case(isl, m, hazards, repairs, hz.expectation(hazards, repairs)))
            else:
                cases.append(Case(isl, m, spec_tokens=base_k, stack=stack, block_size=block_size, control=control))
    if hazards or repairs or not (whole or island == "chain"):
        return cases
    if spec_tokens is None and (block_size is None or block_size > DEFAULT_SPEC):
        cases += [Case("chain", m, spec_tokens=DEFAULT_SPEC, stack=stack, block_size=block_size, control=control)
                  for m in modes if m != "piecewise"]
    if baseline:
        return cases
    for m in modes:
        for h in hz.planted(m, streams):
            if control.upstream and decided_by_vllm(h.sets):
                continue
            if block_size is not None and sequence_needs((h.name,), spec_tokens)[0] >= block_size:
                continue  # its drafts would cross more than one block boundary
            cases.append(case("chain", m, (h.name,), (), hz.expectation((h.name,), ())))
            if h.repairs:
                cases.append(case("chain", m, (h.name,), (h.repairs[0],), "clean"))
    return cases


def run_case(model: Model, provider, case: Case, seq: Sequence, sentinel: int = 0, sizes=None,
             trace=None, progress=None, strict: bool = False, amplify: bool = True,
             reference_every: int | None = None, rules=None) -> CaseResult:
    """One case in lockstep. `strict`: batch variance and nondeterminism fail the case as well.
    `amplify` False: stream races are left to their natural timing (`race.py`). `reference_every`:
    run the independent reference copy every N steps (0: never; None: `reference_copy.default_every`).
    `rules` (a `ControlRules`): the control rules to run with instead of the case's own (the blind
    hunt's blame reruns a minimal sequence with single rules set to their fixed form). `sizes`: the
    capture list; None: vLLM's default for the sequence's request slots and step budget."""
    opts = hz.options_for(case.hazards, case.repairs, case.stack)
    if rules is not None:
        opts = replace(opts, control=rules)
    if not amplify:
        opts = replace(opts, runner=replace(opts.runner, amplify=False))
    k = kind(case.island)
    opts = replace(opts, runner=replace(opts.runner, eager_families=opts.runner.eager_families | k.eager))
    copy_sentinel = opts.sentinel(sentinel)  # a hazard may give the kernels another sentinel
    batches = None
    if k.runs is Runs.ALONE:
        res = run_moe_lockstep(model, provider, seq.batches(), sizes=sizes or DEFAULT_SIZES)
    else:
        usable = None if copy_sentinel == 0 else range(seq.num_slots)
        batches = case_steps(case, seq, usable)
        if reference_every is None:  # a hazard both copies share needs the third copy at its own cadence
            reference_every = hz.reference_cadence(case.hazards, case.stack)
        every = default_every(provider.device) if reference_every is None else reference_every
        asked = sizes  # under vLLM's control, None lets vLLM choose its own list
        sizes = sizes or default_capture_sizes(seq.num_slots, seq.max_tokens, seq.spec_tokens,
                                               opts.control.decode_capture_sizes)
        # the case's shape, built once: a block size's pool (or vLLM's block ids) may hold more state
        # blocks than the sequence's request slots (`run_lockstep` widens its budget to a larger step)
        shape = StepShape.of(seq, sizes=asked if case.control.upstream else sizes, slots=copy_slots(seq, batches))
        with paths_for(case.control, opts.control, model.path, case.block_size) as paths:
            # the third copy keeps the fixed rules of the mirror: independent of the rules under test (the
            # case's, or vLLM's own), it sees a fault both copies share (`check.reference_copy`)
            ref = (ReferenceCopy(independent_copy(model, shape.slots, copy_sentinel, shape.spec_tokens), every)
                   if every > 0 else None)
            try:
                res = run_lockstep(lambda o: model.copy(o, num_slots=shape.slots, sentinel=copy_sentinel,
                                                        spec_tokens=shape.spec_tokens),
                                   provider, batches, mode=case.mode, opts=opts, shape=shape, trace=trace,
                                   progress=progress, reference=ref, paths=paths)
            except KernelRefused as e:  # a kernel whose own sources leave this case's outcome unknown
                return CaseResult(case, 0, None, strict=strict, refused=str(e))
    findings = [f.to_json() for f in res.findings]
    triggered = None if batches is None else reached(case.hazards, case.repairs, case.mode, batches[:res.steps],
                                                     sizes, findings, shape)
    return CaseResult(case, res.steps, res.divergence, findings, res.eager_us, res.replay_us, res.kernel_findings,
                      strict, bound_usage=res.bound_usage, triggered=triggered)


ARRIVAL_GAP = 4  # scheduler ticks between two arrivals, at most (uniform 0..4: about 0.5 a tick)


EDGE_PROMPTS = 0.25  # with K > 0, this share of prompts is 1+K tokens long (vLLM #53051's trigger)
ACCEPT_CYCLE = 4  # kept counts drawn per request with K > 0, cycled over its spec decodes


IDLE_PAUSE = (12, 24)  # ticks a data-parallel rank's stream may pause before a request, so it goes idle


SHARED_PREFIX = 0.5  # with a block size, this share of requests repeats an earlier one's first prompt tokens
PREFIX_REACH = 4  # ... one of the last this many requests
ALIGNED_PROMPTS = 0.5  # with a block size, this share of prompts is m * block_size + 1+K (+-1) tokens long


def request_stream(seed: int, max_prompt: int = 8, max_decode: int = 24, spec_tokens: int = 0,
                   data_parallel: bool = False, block_size: int | None = None):
    """The seed's requests, one after another, each drawn from the same generator in the same
    order and arriving no earlier than the one before: the first k requests of a seed are the
    same whatever k is. With K > 0 each request also draws the kept counts (1..1+K) of its spec
    decodes; with K = 0 nothing more is drawn, so K = 0 streams are the same as without drafts. A
    data-parallel rank's stream pauses before one request in three but the first (IDLE_PAUSE), long enough for
    its requests to finish, so it runs dummy steps between real ones (an idle rank in vLLM #37728).
    With a block size each request then also draws (so streams without one are unchanged) a prompt
    near a multiple of the block size plus 1+K (ALIGNED_PROMPTS: the short tails a block-aligned
    split leaves) and a prefix shared with a recent request (SHARED_PREFIX: prefix hits)."""
    rng = random.Random(seed)
    t = 0
    prompts: list[int] = []
    for rid in itertools.count():
        t += rng.randint(0, ARRIVAL_GAP)
        if data_parallel and rng.random() < 1 / 3 and rid:
            t += rng.randint(*IDLE_PAUSE)
        prompt, decode = rng.randint(1, max_prompt), rng.randint(1, max_decode)
        if spec_tokens and rng.random() < EDGE_PROMPTS:
            prompt = decode_len(spec_tokens)  # a prompt of a decode's shape: the uniform-decode rule's edge
        preempt = rng.choice([None, None, None, rng.randint(1, 4)])
        accept = [rng.randint(1, decode_len(spec_tokens)) for _ in range(ACCEPT_CYCLE)] if spec_tokens else None
        prefix_of, prefix_len = None, 0
        if block_size:
            if rng.random() < ALIGNED_PROMPTS:
                prompt = max(1, rng.randint(1, 3) * block_size + decode_len(spec_tokens) + rng.choice((-1, 0, 1)))
            if rid and rng.random() < SHARED_PREFIX:
                prefix_of = rng.randint(max(0, rid - PREFIX_REACH), rid - 1)
                prefix_len = min(prompts[prefix_of], prompt)
        prompts.append(prompt)
        yield Request(rid=rid, prompt_len=prompt, decode_steps=decode, arrive=t, preempt_after=preempt, accept=accept,
                      prefix_of=prefix_of, prefix_len=prefix_len)


SETTING_DRAWN = 0.5  # with K > 0 or a data-parallel rank: the share of seeds that set each scheduler setting
PEERS_DRAWN = 8  # the other data-parallel rank's batches a seed draws, cycled over the steps


def scheduler_settings(seed: int, spec_tokens: int = 0, data_parallel: bool = False, max_tokens: int = 16,
                       num_slots: int = 8) -> dict:
    """The scheduler settings beyond the budget a seed's sequence runs with (`scheduler/config.py`),
    drawn from a generator of their own so the request stream is the same with them or without:
    none at K = 0 on one rank (the sequences `repro run` always ran); with K > 0 or on a
    data-parallel rank, each of a scheduled budget of whole decodes (a multiple of 1+K, so the decodes
    that fit make a uniform step: vLLM cuts a decode's drafts to the budget left) of at most
    `max_tokens` under a batch of twice that (`max_tokens` in the result: the capture sizes reach
    past the budget), a long prefill threshold of a few decodes' tokens and async scheduling in half the seeds, and on a
    data-parallel rank the other rank's batches (idle, uniform decodes or a mixed batch)."""
    if not (spec_tokens or data_parallel):
        return {}
    rng, q = random.Random(f"scheduler settings {seed}"), decode_len(spec_tokens)
    out: dict = {}
    if rng.random() < SETTING_DRAWN:  # under a batch twice the budget, whose capture sizes reach past it
        # whole decodes: a step of the decodes that fit is uniform, and the rest are parked beside it
        out.update(max_num_scheduled_tokens=q * rng.randint(1, max_tokens // q), max_tokens=2 * max_tokens)
    if rng.random() < SETTING_DRAWN:
        out["long_prefill_token_threshold"] = rng.randint(q, min(max_tokens, 2 * q + 1))
    out["async_scheduling"] = rng.random() < SETTING_DRAWN
    if data_parallel:
        uniform = range(1, min(num_slots, max_tokens // q) + 1)
        out["dp_peers"] = [rng.choice(([0, True], [rng.choice(uniform) * q, True], [rng.randint(1, max_tokens), False]))
                           for _ in range(PEERS_DRAWN)]
    return out


def case_sequence(case: Case, seed: int, steps: int) -> Sequence:
    """The seeded sequence a case runs: its draft tokens a decode, and an idle data-parallel
    rank's dummy steps when it has them."""
    return default_sequence(seed, steps, spec_tokens=case.spec_tokens, data_parallel=case.data_parallel,
                            block_size=case.block_size)


def default_sequence(seed: int, steps: int, num_slots: int = 8, vocab: int = 512, spec_tokens: int = 0,
                     data_parallel: bool = False, block_size: int | None = None, max_tokens: int = 16) -> Sequence:
    """The seeded sequence's first `steps` scheduler steps: one sequence per seed, cut, so a
    shorter run is the start of a longer one (a divergence at step 12 of a 30-step run is the
    last step of a 13-step run). With K > 0 or a data-parallel rank the seed also draws the
    scheduler's settings (`scheduler_settings`).

    Enough of the seed's request stream is taken that the next request never made it into those
    steps: a later one arrives no earlier and the scheduler admits in arrival order, so it could
    not have either, and more requests would change nothing before the cut. The requests kept are
    those up to the last one scheduled."""
    stream = request_stream(seed, spec_tokens=spec_tokens, data_parallel=data_parallel, block_size=block_size)
    reqs = list(itertools.islice(stream, steps // 2 + 8))
    kw = dict(num_slots=num_slots, vocab=vocab, seed=seed, max_steps=steps, spec_tokens=spec_tokens,
              data_parallel=data_parallel, block_size=block_size, max_tokens=max_tokens)
    kw.update(scheduler_settings(seed, spec_tokens, data_parallel, max_tokens, num_slots))
    while True:
        seq = Sequence(reqs, **kw)
        batches = seq.batches()
        if len(batches) == steps and all(reqs[-1].rid not in b.request_ids for b in batches):
            last = max((rid for b in batches for rid in b.request_ids), default=0)
            return Sequence(reqs[:last + 1], **kw)
        reqs += list(itertools.islice(stream, len(reqs) // 4 + 8))
