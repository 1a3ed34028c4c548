"""`repro bench --lockstep-rates`: checked lockstep steps/s per island and Hypothesis examples/s
on the chosen checkpoint and device, with the whole-state and weight checks on.

Per case (the islands of `repro run` at baseline: `chain` piecewise and full, `submod0`,
`submod1`, `gdn_core`, `moe`): one seeded sequence of `steps` scheduler steps (mixed prefills
and decodes, up to 8 requests), run through the lockstep as `repro run` runs it, once with the
device check (`check="device"`: one read per step, every state slot, every weight) and once with
the host path (`check="host"`: per-tensor comparisons on the host) for comparison, and once
`unchecked`: the two copies alone (eager and replay, one synchronisation a step, nothing
compared), the floor a check sits on, so what the
check itself costs is a difference of two rows of one run. Reported: steps/s over the whole run
(captures included) and in steady state (steps that captured nothing), and where a steady step's
time goes (`lockstep.Phases`: eager, replay, compare, weights, read, prepare, oracle, in us and
as fractions of the step's wall time; device events on a GPU, so host phases overlap). The first
case runs once untimed before any is timed: Triton compiles and autotunes each kernel variant on
first use (seconds), which would otherwise land in whichever case met it first. Nothing here
asserts a timing.
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch

from ..check.compare import Divergence
from ..check.reference_copy import ReferenceCopy, default_every, independent_copy
from ..graphs import TapeProvider
from ..islands import Model, Runs, kind
from ..job.cases import Case, default_sequence, run_case
from ..job.results import device_name
from ..knobs import hazards as hz
from ..knobs.modes import DEFAULT_MODES
from ..lockstep import Lockstep, LockstepResult, Phases, moe_copies, run_lockstep, run_moe_lockstep
from ..model.tiny import default_checkpoint
from ..search.hunt import hunt
from ..control.shape import decode_len
from ..control.shape import StepShape

TARGET_STEPS_PER_S = 300  # the target: every island, real dimensions, B <= 8, one H200
CASES = (("chain", "piecewise"), ("chain", "full"), ("submod0", "piecewise"), ("submod1", "piecewise"),
         ("gdn_core", "full"), ("moe", "piecewise"))
# "reference": the device check plus the independent third copy at its default cadence for the
# device (`reference_copy`: every step on the CPU, every 16 on a GPU), or at each cadence asked
# for (`every`): what the third copy costs.
# "unchecked": no check at all (`run_unchecked`), the floor the others are read against.
CHECKS = ("device", "host", "reference", "unchecked")


def run_checked(model, provider, island: str, mode: str, seq, check: str = "device", every: int | None = None):
    """One baseline case as `job.cases.run_case` runs it, with the lockstep's check chosen (`every`: the
    third copy's cadence for check "reference"; None: the device's default)."""
    if kind(island).runs is Runs.ALONE:  # the moe island has no third copy: its "reference" row is the device check
        if check == "unchecked":
            return run_unchecked(provider, seq.batches(), moe=model)
        return run_moe_lockstep(model, provider, seq.batches(), check="host" if check == "host" else "device")
    ref, k = None, seq.spec_tokens
    if check == "reference":
        ref = ReferenceCopy(independent_copy(model, seq.num_slots, 0, k),
                            default_every(provider.device) if every is None else every)
        check = "device"
    opts = hz.options_for((), ())
    opts = replace(opts, runner=replace(opts.runner, eager_families=opts.runner.eager_families | kind(island).eager))
    make = lambda o: model.copy(o, num_slots=seq.num_slots, sentinel=0, spec_tokens=k)
    if check == "unchecked":
        return run_unchecked(provider, seq.batches(), make, mode, opts, StepShape.of(seq))
    return run_lockstep(make, provider, seq.batches(), mode=mode, opts=opts, shape=StepShape.of(seq), check=check,
                        reference=ref)


def run_unchecked(provider, batches, make_copy=None, mode="piecewise", opts=None, shape: StepShape = StepShape(),
                  moe=None):
    """The lockstep's two copies with nothing checked: each step prepared, run through the eager and
    the replay copy (built and captured as `Lockstep` / `run_moe_lockstep` build them; `moe`: the
    model, for the moe island), the next step prepared, one synchronisation. No comparison, no state
    snapshot for the oracle, no weight digest: the floor of a checked step on this machine. Timed by
    the same `Phases` (eager, replay; prepare and read on the host)."""
    if moe is not None:
        eager_island, runner = moe_copies(moe, provider, batches)
        ph = Phases(provider.device)

        def eager(b):
            with torch.inference_mode():
                return eager_island(input_ids=b.ids(provider.device))
        replay, graphs = (lambda b: runner.step(b.host_ids())), runner
    else:
        ls = Lockstep(make_copy, provider, mode, opts, shape, check="host")
        ph, eager, replay, graphs = ls.phases, ls.eager.step, ls.graph.step, ls.graph
    for i, b in enumerate(batches):
        ph.start()
        captures = graphs.captures
        t = time.perf_counter()
        b.prepare()
        ph.host("prepare", t)
        eager(b)
        ph.mark("eager")
        replay(b)
        ph.mark("replay")
        if i + 1 < len(batches):
            t = time.perf_counter()
            batches[i + 1].prepare()
            ph.host("prepare", t)
        t = time.perf_counter()
        provider.synchronize()
        ph.host("read", t)
        ph.stop(steady=graphs.captures == captures)
        b.release()
    n = max(len(batches), 1)
    return LockstepResult(len(batches), None, [], ph.us["eager"] / n, ph.us["replay"] / n, graphs.replays,
                          graphs.captures, {}, ph.to_json())


def lockstep_rates(model, provider, steps: int = 400, examples: int = 20, seed: int = 0, checks=CHECKS,
                   cases=CASES, log=None, every=None, spec_tokens: int = 0) -> dict:
    """Steps/s per case and check, and Hypothesis examples/s (device check), on `model`
    (an `islands.Model`) and `provider`. `every`: the third copy's cadences, one "reference" row
    each (default: the device's, `reference_copy.default_every`); a row says how many steps the
    third copy ran. The moe island has no third copy: one "reference" row, the device check.
    `spec_tokens` K > 0: each chain case runs again on the seed's sequence with K draft tokens a
    decode (spec decodes, seeded acceptance, 1+K-token prompts), its rows beside K = 0's. That
    sequence's step budget is K = 0's times 1+K, so a step holds as many requests, and vLLM's default
    capture list (`default_capture_sizes`) reaches its budget, as K = 0's reaches 16."""
    every = tuple(every) if every else (default_every(provider.device),)
    log = log or (lambda s: None)
    seqs = {0: default_sequence(seed, steps, vocab=model.cfg.vocab_size)}
    if spec_tokens:
        seqs[spec_tokens] = default_sequence(seed, steps, vocab=model.cfg.vocab_size, spec_tokens=spec_tokens,
                                             max_tokens=seqs[0].max_tokens * decode_len(spec_tokens))
    runs = [(island, mode, k) for island, mode in cases for k in (seqs if island == "chain" else (0,))]
    out: dict = {"checkpoint": str(model.path), "device": device_name(provider), "provider": provider.name,
                 "steps": steps, "target_steps_per_s": TARGET_STEPS_PER_S,
                 "host_us_per_op": host_us_per_op(provider.device), "cases": []}
    for k in seqs if runs else ():  # compile and autotune every kernel the sequences need before the first timed case
        run_checked(model, provider, *(runs[0][:2]), seqs[k], "device" if "device" in checks or not checks else checks[0])
    for island, mode, k in runs:
        seq = seqs[k]
        for check in checks:
            for n in (every if check == "reference" and island != "moe" else (None,)):
                before = host_us_per_op(provider.device, calls=500)
                t0 = time.perf_counter()
                r = run_checked(model, provider, island, mode, seq, check, n)
                dt = time.perf_counter() - t0
                after = host_us_per_op(provider.device, calls=500)
                ph = r.phases
                row = {"island": island, "mode": mode, "spec_tokens": k, "check": check, "reference_every": n,
                       "reference_steps": r.reference_steps, "steps": r.steps, "captures": r.captures,
                       "diverged": r.divergence is not None, "run_steps_per_s": round(r.steps / dt, 2),
                       **{k: ph.get(k) for k in ("steady_steps", "steady_steps_per_s", "step_us", "timing",
                                                 "us_per_step", "fractions")}}
                row["meets_target"] = (row["steady_steps_per_s"] or 0) >= TARGET_STEPS_PER_S
                # the machine's host speed just before and after the row (it drifts within a run), and
                # the step's cost in small-op times: steps/s x us/op is the machine; this is the code
                row["host_us_range"] = [before, after]
                row["host_us_per_op"] = us = round((before + after) / 2, 2)
                row["op_times"] = round(1e6 / (row["steady_steps_per_s"] * us)) if row["steady_steps_per_s"] else None
                out["cases"].append(row)
                log(f"  lockstep {island:<8} {_mode_name(row):<9} {_check_name(row):<12} {row['steady_steps_per_s']} steps/s "
                    f"steady, {row['run_steps_per_s']} with captures")
    if examples:
        out["hunt"] = hunt_rate(model, provider, examples)
        log(f"  hunt {out['hunt']['examples_per_s']} examples/s ({out['hunt']['examples']} examples)")
    return out


def host_us_per_op(device, calls: int = 2000) -> float:
    """This machine's host speed in the same run: microseconds of host time per call of one small
    aten op on `device` (`x.add(x)`, median of 5 batches, no synchronisation inside a batch). A
    checked step is host-bound, so steps/s from two machines compare only after dividing by this
    (GPU machines of one kind differed by up to 1.6x in steps/s for the same tree)."""
    import statistics

    import torch
    x = torch.ones(8, device=device)
    sync = getattr(torch, torch.device(device).type, None)
    times = []
    for _ in range(6):
        t = time.perf_counter()
        for _ in range(calls):
            x.add(x)
        times.append((time.perf_counter() - t) / calls * 1e6)
        if sync is not None and hasattr(sync, "synchronize"):
            sync.synchronize()
    return round(statistics.median(times[1:]), 2)


def hunt_rate(model, provider, examples: int) -> dict:
    """Hypothesis examples/s of `repro hunt` (chain piecewise, baseline, the `ci` profile)."""
    calls = 0

    def check(s):
        nonlocal calls
        calls += 1
        r = run_case(model, provider, Case("chain", "piecewise"), s)
        return r.divergence

    t0 = time.perf_counter()
    hunt(check, max_examples=examples, profile="ci", vocab=model.cfg.vocab_size)
    dt = time.perf_counter() - t0
    return {"examples": calls, "examples_per_s": round(calls / dt, 2), "seconds": round(dt, 2)}


def _check_name(row: dict) -> str:
    """A row's check as the table shows it: `reference/16` for the third copy every 16 steps."""
    n = row.get("reference_every")
    return f"{row['check']}/{n}" if n is not None else row["check"]


def _mode_name(row: dict) -> str:
    """A row's mode as the table shows it: `full K=2` for a chain case with two draft tokens a decode."""
    k = row.get("spec_tokens") or 0
    return f"{row['mode']} K={k}" if k else row["mode"]


def spec_ratios(r: dict) -> list[tuple[str, str, float, float | None]]:
    """(island, mode, K>0 steady steps/s over K=0's, the same in small-op times) for each device-check
    case measured at both. The second is K=0's op-times over K's: a step's cost in the host's own
    unit, so a host that speeds up or slows down between the two rows does not move it."""
    dev = {(c["island"], c["mode"], c.get("spec_tokens") or 0): c for c in r["cases"]
           if c["check"] == "device" and c.get("steady_steps_per_s")}

    def ops(a, b):
        return round(b["op_times"] / a["op_times"], 3) if a.get("op_times") and b.get("op_times") else None
    return [(i, m, round(c["steady_steps_per_s"] / dev[(i, m, 0)]["steady_steps_per_s"], 3), ops(c, dev[(i, m, 0)]))
            for (i, m, k), c in dev.items() if k and (i, m, 0) in dev]


def _check_cost(row: dict, cases: list) -> str:
    """What a checked row's check adds to the two copies alone: its op-times less those of its case's
    unchecked row (`+N`), "-" where either is missing (or for the unchecked row itself)."""
    floor = next((c.get("op_times") for c in cases if c["check"] == "unchecked"
                  and (c["island"], c["mode"], c.get("spec_tokens")) == (row["island"], row["mode"],
                                                                         row.get("spec_tokens"))), None)
    if row["check"] == "unchecked" or floor is None or row.get("op_times") is None:
        return "-"
    return f"{row['op_times'] - floor:+d}"


def format_rates(r: dict) -> str:
    """The table `repro bench --lockstep-rates` prints."""
    head = ("island", "mode", "check", "steps/s", "w/ captures", "host us/op", "op-times", "check cost", "eager",
            "replay", "compare", "weights", "read", "prepare", "oracle")
    rows = [head]
    for c in r["cases"]:
        f = c["fractions"] or {}
        rows.append((c["island"], _mode_name(c), _check_name(c), str(c["steady_steps_per_s"]), str(c["run_steps_per_s"]),
                     str(c.get("host_us_per_op")), str(c.get("op_times")), _check_cost(c, r["cases"]),
                     *(f"{f.get(k) or 0:.0%}" for k in ("eager", "replay", "compare", "weights", "read", "prepare",
                                                          "oracle"))))
    widths = [max(len(x[i]) for x in rows) for i in range(len(head))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(x, widths)).rstrip() for x in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"lockstep on {r['device']} ({r['provider']}), {r['steps']} steps a case; steps/s in steady state "
                 f"(steps without a capture); host us/op: the machine's speed around the row; op-times: a steady "
                 f"step in small-op times (comparable across machines where a step is host-bound: a GPU); check cost: "
                 f"op-times over the case's unchecked row (the two copies alone, nothing compared); time "
                 f"shares of a steady step ({r['cases'][0]['timing'] if r['cases'] else '-'})")
    target = target_line(r)
    if target:
        lines.append(target)
    for island, mode, ratio, op_ratio in spec_ratios(r):
        lines.append(f"{island} {mode}: the device check at K={max(c.get('spec_tokens') or 0 for c in r['cases'])} "
                     f"runs {ratio:.2f}x the steady steps/s of K=0 (same run)"
                     + (f"; {op_ratio:.2f}x in small-op times (the host's drift removed)" if op_ratio else ""))
    if "hunt" in r:
        lines.append(f"hunt: {r['hunt']['examples_per_s']} examples/s ({r['hunt']['examples']} examples)")
    if r.get("host_us_per_op") is not None:
        lines.append(f"host speed: {r['host_us_per_op']} us per small op call (compare machines by it)")
    return "\n".join(lines)


def target_line(r: dict) -> str | None:
    """The target in one line: which rows of the device check (every output, state slot and weight
    digest compared) reach `TARGET_STEPS_PER_S`, the slowest host, in us a small op, on which the
    one with the most op-times still would (a rough guide: op-times carry across machines only
    roughly), and the same count with the third copy at its cadence (measured alongside; the target
    is the device check's). None without device-check rows. The target is stated for real
    dimensions on one H200: on the CPU tape the line only reads the figures against it."""
    rows = [c for c in r["cases"] if c["check"] == "device" and c.get("op_times")]
    if not rows:
        return None

    def met(rs):
        below = [c for c in rs if not c["meets_target"]]
        text = f"met by {len(rs) - len(below)} of {len(rs)} rows"
        return text + (" (below: " + ", ".join(f"{c['island']} {c['mode']} {_check_name(c)} {c['steady_steps_per_s']}"
                                               for c in below) + ")" if below else "")
    worst = max(rows, key=lambda c: c["op_times"])
    line = (f"target {TARGET_STEPS_PER_S} checked steps/s (the device check): {met(rows)}; the most "
            f"op-times, {worst['op_times']} ({worst['island']} {worst['mode']}), reach it on hosts up to "
            f"{1e6 / (TARGET_STEPS_PER_S * worst['op_times']):.1f} us a small op")
    third = [c for c in r["cases"] if c["check"] == "reference" and c.get("op_times")]
    return line + (f"; with the third copy: {met(third)}" if third else "")


# --------------------------------------------------------------------------- CPU tiny rates


def tiny_rates(steps: int = 60, examples: int = 20, seed: int = 0, cache=None) -> dict:
    """On the CPU tape with the embedded tiny checkpoint: lockstep steps/s per mode (eager and
    replay copies in lockstep, compared every step) and Hypothesis examples/s at baseline. Runs
    on the default kernel providers: a `--kernels` selection is for the device, not the CPU."""
    from kernels import registry
    with registry.defaults():
        return _tiny_rates(steps, examples, seed, cache)


def _tiny_rates(steps: int, examples: int, seed: int, cache=None) -> dict:

    provider = TapeProvider("cpu")
    model = Model(default_checkpoint(cache), "cpu")
    seq = default_sequence(seed, steps, vocab=model.cfg.vocab_size)
    out: dict = {"checkpoint": "tiny (embedded)", "device": "cpu"}
    for mode in DEFAULT_MODES:
        t0 = time.perf_counter()
        r = run_case(model, provider, Case("chain", mode), seq)
        dt = time.perf_counter() - t0
        out[f"lockstep_{mode}_steps"] = r.steps
        out[f"lockstep_{mode}_steps_per_s"] = round(r.steps / dt, 2)
    calls = 0

    def check(s):
        nonlocal calls
        calls += 1
        r = run_case(model, provider, Case("chain", "piecewise"), s)
        if not r.diverged:
            return None
        fd = r.first_divergence
        return Divergence(fd["step"], fd["island"], fd["tensor"], fd["row"], fd["request"], fd["slot"], fd["max_abs"])

    t0 = time.perf_counter()
    hunt(check, max_examples=examples, profile="ci", vocab=model.cfg.vocab_size)
    dt = time.perf_counter() - t0
    out["hypothesis_examples"] = calls
    out["hypothesis_examples_per_s"] = round(calls / dt, 2)
    return out


# --------------------------------------------------------------------------- driver
