"""Reading a result file, choosing the result a report is about, and the steps that result ran."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import BadInput
from ..io import read_json
from ..knobs import hazards as hz
from ..model.checkpoint import Checkpoint
from ..model.config import GDN, ConfigError
from ..job.results import Case
from ..scheduler.sequence import Sequence
from .schema import check_document
from ..control.shape import decode_len


def load_result(path) -> dict:
    """Read and check a result file from `repro run --json` or `repro hunt`; BadInput if unusable."""
    doc = read_json(path, "result file")
    check_result(doc, str(path))
    return doc


def check_result(doc, name: str = "the result") -> None:
    """One line naming what is wrong, before any work: a report on a damaged file would mislead."""
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list) or not doc["results"]:
        raise BadInput(f"{name} is not a `repro run --json` / `repro hunt` result: it needs a non-empty `results` list")
    if any(isinstance(r, dict) and (r.get("island") == "forced_comm" or "comm_mode" in r) for r in doc["results"]):
        raise BadInput(f"{name} is a forced_comm (multi-rank) result: reports cover the single-rank islands only; "
                       "its rows (ranks_diverged, first_divergence) say what each rank saw")
    check_document(doc, name)  # field by field (`schema.py`), the rows before the sequence


def _hand_written(hazards=None) -> str:
    """The torch-only reproducers written by hand (the hazard table's `script`), for `hazards` or all."""
    rows = [h for h in hz.HAZARDS.values() if h.script and (hazards is None or h.name in hazards)]
    return "; ".join(f"python3 {h.script} ({h.cases.split(',')[0].split(' (')[0]})" for h in rows)


def standalone_gap(r: dict) -> str | None:
    """Why no standalone script can be generated for result `r` (None: it can). The generated
    script drives steps with draft tokens or without, an idle rank's dummy steps and prefix caching,
    but it compares eager with replay (no third copy); where a hazard has a hand-written reproducer,
    the reason names it."""
    if r["island"] not in hz.CHAIN_ISLANDS:
        return f"island {r['island']} is not rebuilt by the standalone script yet (it covers the GDN layer chain)"
    bad = [h for h in r["hazards"] if not hz.HAZARDS[h].standalone]
    if bad:
        have = ", ".join(h.name for h in hz.HAZARDS.values() if h.standalone)
        own = _hand_written(bad)
        return (f"hazard {', '.join(bad)}: no standalone script is generated for it yet (the script reproduces "
                f"{have} and baseline divergences)" + (f"; its hand-written reproducer: {own}" if own else ""))
    bad = [x for x in r["repairs"] if not hz.REPAIRS[x].standalone]
    if bad:
        return f"repair {', '.join(bad)} is not rebuilt by the standalone script yet"
    if (r.get("microscope") or {}).get("departed") == "both":
        return ("eager and replay agree here and the independent third copy departs from both: a fault both copies "
                "share, which the generated script cannot show, since it compares eager with replay (hand-written "
                f"reproducers: {_hand_written()})")
    return None


def pick(doc: dict, index: int | None = None) -> int:
    """The result the report is about: `index`, else the first unexpected divergence (an upstream
    bug), else the first divergence the standalone script can rebuild (so a default run's report
    comes with a script), else the first divergence, else the first result."""
    rs = doc["results"]
    if index is not None:
        if not 0 <= index < len(rs):
            raise BadInput(f"--case {index}: the result file has {len(rs)} results (0..{len(rs) - 1})")
        return index
    for want in (lambda r: r.get("expect", "clean") == "clean", lambda r: standalone_gap(r) is None,
                 lambda r: True):
        for i, r in enumerate(rs):
            if r["diverged"] and want(r):
                return i
    return 0


def kernel_sentinel(r: dict, sentinel: int | None) -> int:
    """The sentinel the kernels of result `r` skipped: a hazard may force its own (the table says)."""
    return hz.options_for(r["hazards"]).sentinel(sentinel if sentinel is not None else 0)


def _matches(step: dict, ctx: dict) -> bool:
    return all(step.get(a) == ctx.get(b) for a, b in (("request_ids", "requests"), ("slots", "slots"),
                                                      ("query_lens", "query_lens")) if b in ctx)


def steps_that_ran(doc: dict, r: dict, sentinel: int | None):
    """(steps, sequence json, source): the steps `run_case` fed the lockstep for result `r`, up to
    and including the first divergent step.

    A hunt's `minimal_sequence` carries them. `repro run --json` writes its sequence's steps as
    scheduled for the default slot range, while a run whose kernel sentinel is -1 used slots
    0..N-1: the candidate whose divergent step matches the microscope's context is taken."""
    seqj = doc.get("minimal_sequence") or r.get("sequence") or doc["sequence"]  # a row may run its own
    source = "hunt" if "minimal_sequence" in doc else "run"
    seq = Sequence.from_json(seqj)
    explicit = [dict(s) for s in seq.steps]
    candidates = [explicit] if explicit else []
    ks = kernel_sentinel(r, sentinel)
    if seq.requests:
        bare = dataclasses.replace(seq, steps=[])
        scheduled = [b.to_json() for b in bare.batches(None if ks == 0 else range(seq.num_slots))]
        if source == "run" and ks != 0:
            candidates.insert(0, scheduled)  # what run_case scheduled for a -1 sentinel
        else:
            candidates.append(scheduled)
    if not candidates:
        raise BadInput("the result's sequence has neither requests nor steps")
    fd = r.get("microscope") or r.get("first_divergence") or {}
    ctx = (fd.get("context") or {}).get("this_step") or {}
    chosen = candidates[0]
    if r["diverged"] and ctx:
        for cand in candidates:
            st = next((s for s in cand if s.get("step") == fd["step"]), None)
            if st is not None and _matches(st, ctx):
                chosen = cand
                break
    if r["diverged"]:
        k = next((i for i, s in enumerate(chosen) if s.get("step") == r["first_divergence"]["step"]), None)
        if k is not None:
            chosen = chosen[:decode_len(k)]
    # the settings the steps were made with: a replay at another K or block size is another run
    out = {k: seqj[k] for k in _RERUN_KEYS if k in seqj and (seqj[k] or k in ("num_slots", "max_tokens", "vocab", "seed"))}
    used = {rid for s in chosen for rid in s["request_ids"]}
    out["requests"] = [q for q in seqj.get("requests", []) if q.get("rid") in used]
    out["steps"] = chosen
    return chosen, out, source


def recorded_steps(doc: dict) -> int | None:
    """How many steps the hunt's minimal sequence has (what `repro hunt` printed); None for a run."""
    ms = doc.get("minimal_sequence")
    return len(ms.get("steps", [])) if isinstance(ms, dict) else None


def check_layer(doc: dict, layer: int | None) -> None:
    """An explicit `--layer` must be one the result's islands can be built from: the layer the run
    recorded, if it did, and a layer of the right type in its checkpoint, where that is readable
    here (a report for another layer would carry a replay line that fails)."""
    if layer is None:
        return
    ran = doc.get("layer")
    if isinstance(ran, int) and ran != layer:
        raise BadInput(f"--layer {layer}: the result was run with --layer {ran}")
    ck = doc.get("checkpoint")
    if not ck or not Path(ck).is_dir():
        return
    cfg = Checkpoint.open(ck).config
    try:
        kind = cfg.layer_type(layer)
    except ConfigError as e:
        raise BadInput(f"--layer {layer}: {e} ({Path(ck).name})") from None
    if kind != GDN and any(r["island"] in hz.CHAIN_ISLANDS for r in doc["results"]):
        gdn = ", ".join(map(str, cfg.gdn_layers()[:8]))
        raise BadInput(f"--layer {layer}: a {kind} layer, and the result's islands are built from a GDN layer ({gdn})")


# The sequence fields a re-run takes from the result's sequence (the steps themselves come apart).
_RERUN_KEYS = ("num_slots", "max_tokens", "vocab", "seed", "spec_tokens", "data_parallel", "block_size")


def rerun_sequence(seqj: dict, steps: list) -> Sequence:
    """The recorded `steps` as a sequence with the result's own settings (its draft tokens a decode,
    dummy steps, block size), so a re-run builds the copies the run had."""
    return Sequence(requests=[], steps=steps, **{k: seqj[k] for k in _RERUN_KEYS if k in seqj})


def rerun_case(r: dict, hazards=None, repairs=None) -> Case:
    """Result row `r` as a case (its hazards and repairs unless given), with its K, dummy steps,
    block size and stack."""
    return Case(r["island"], r["mode"], tuple(r["hazards"] if hazards is None else hazards),
                tuple(r["repairs"] if repairs is None else repairs), spec_tokens=r.get("spec_tokens") or 0,
                data_parallel=bool(r.get("data_parallel")), stack=r.get("stack", "fixed"),
                block_size=r.get("block_size"))

