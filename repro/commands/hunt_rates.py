"""`repro bench --hunt-rates`: how fast a hunt reaches each bug of the public record, in seconds
from the search's start to the first failing sequence and to the minimal one.

Per record hazard, two hunts of the chain, each derandomised (the `ci` profile) and bounded by
`examples` sequences, the shrinking included:
- told: `repro hunt --hazard H` on the fixed stack (the bug planted, the hunt asked for it);
- blind: `repro hunt --stack S` with no hazard, S the first stack profile whose control rules
  depart from the fixed form in a rule H sets (`knobs.stacks.differs`): the release searched as
  it is, then the rule at fault named (`search.blame`). Hazards that set no control rule
  (a kernel's sentinel, a splitting op's fresh tensor) have no profile that carries them.
Both draw the sequences the hazard needs (its K drafts a decode, dummy steps for an idle
data-parallel rank): a blind hunt is told where to look, not what is there. A hazard the provider
cannot run (streams on the CPU tape), or whose configuration the selected fused GDN core refuses
(`Hazard.fused_refused`), is skipped with its reason. Each hunt runs under the kernels selected
around it (`repro bench --kernels gdn=xpu_semantics`: what a B70's kernel does). Nothing here asserts
a timing.
"""
from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

from kernels.gdn import fused

from ..knobs import hazards as hz
from ..knobs.stacks import STACKS, differs
from .hunt import HuntConfig, run_hunt


def blind_stack(h, only: str | None = None) -> tuple[str | None, str]:
    """(the profile a blind hunt for hazard `h` searches, or None; why none). `only`: the profile
    asked for (`--stack`), which must carry one of the hazard's rules."""
    if not h.rules:
        return None, "n/a: no stack profile sets it (it is no control rule)"
    for s in STACKS.values():
        if s.name != "fixed" and (only in (None, "fixed") or s.name == only) \
                and set(differs(hz.options_for((), (), s.name).control)) & set(h.rules):
            return s.name, ""
    where = f"stack {only}" if only not in (None, "fixed") else "no stack profile"
    return None, f"n/a: {where} departs from the fixed form in its rules ({', '.join(h.rules)})"


def skip_reason(h, streams: bool) -> str | None:
    if (h.device_only or h.stream) and not streams:
        return "needs device streams: the CPU tape has none"
    if fused() and h.fused_refused:
        return f"refused by the fused GDN core: {h.fused_refused}"
    return None


def _divergence(doc: dict, stats: dict) -> dict:
    """Where the minimal sequence first diverges, and what it hurt there (`Lockstep.damage`: the state
    blocks the copies hold apart, whether a live request's)."""
    fd = (doc["results"][0].get("first_divergence") or {}) if doc and doc["results"] else {}
    out = {k: fd.get(k) for k in ("step", "island", "tensor")} if fd else {"step": None}
    out["line"] = stats.get("first_divergence")
    out["damage"] = ((doc["results"][0].get("microscope") or {}).get("damage")) if doc else None
    return out


def one(cfg: HuntConfig, quiet: bool) -> tuple[dict, dict | None]:
    """Run one hunt with its printed lines kept out of the bench's table; (stats, result doc)."""
    stats: dict = {}
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), (contextlib.redirect_stderr(sink) if quiet else contextlib.nullcontext()):
        _, doc = run_hunt(cfg, stats)
    return stats, doc


def _row(stats: dict, doc: dict | None) -> dict:
    row = {"found": doc is not None, "first_s": stats.get("first_s"), "minimal_s": stats.get("minimal_s"),
           "examples": stats.get("examples")}
    if doc is not None:
        row.update(minimal_steps=stats.get("minimal_steps"), first_divergence=_divergence(doc, stats),
                   minimal_sequence=doc["minimal_sequence"], mode=doc["mode"])
    return row


def hunt_rates(model: str, device: str, examples: int = 60, stack: str = "fixed", spec_tokens: int | None = None,
               streams: bool = False, quiet: bool = False, log=None, cache=None, block_size: int | None = None) -> dict:
    """{hazard: {told: {...}, blind: {...} | None, blind_why?, skipped?}} for every record hazard; with a
    `block_size` every hunt runs with prefix caching, and a hazard whose drafts are not below it is
    skipped (`check_block_size`)."""
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="repro-hunt-rates-") as tmp:
        for h in (h for h in hz.HAZARDS.values() if h.record):
            why = skip_reason(h, streams)
            k = spec_tokens if spec_tokens is not None else h.spec_tokens
            if block_size is not None and k >= block_size:
                why = why or f"needs {k} draft tokens: a block of {block_size} must be wider"
            if why:
                out[h.name] = {"skipped": why, "told": None, "blind": None}
                continue
            base = dict(model=model, device=device, island="chain", spec_tokens=spec_tokens, max_examples=examples,
                        profile="ci", cache=cache, block_size=block_size)
            told_cfg = HuntConfig(hazards=(h.name,), save=str(Path(tmp) / f"{h.name}-told.json"), **base)
            row: dict = {"told": _row(*one(told_cfg, quiet))}
            if log:
                log(f"  hunt-rates {h.name}: told {_brief(row['told'])}")
            s, why = blind_stack(h, stack)
            if s is None:
                row.update(blind=None, blind_why=why)
            else:
                k, dp = h.spec_tokens, h.data_parallel
                blind_cfg = HuntConfig(stack=s, data_parallel=dp, save=str(Path(tmp) / f"{h.name}-blind.json"),
                                       **{**base, "spec_tokens": spec_tokens if spec_tokens is not None else k})
                stats, doc = one(blind_cfg, quiet)
                b = (doc or {}).get("blame") or {}
                row["blind"] = {"stack": s, **_row(stats, doc), "blame_s": stats.get("blame_s"), "rule": b.get("rules"),
                                "upstream": b.get("upstream"), "hazards": b.get("hazards")}
                if log:
                    log(f"  hunt-rates {h.name}: blind {s} {_brief(row['blind'])}")
            out[h.name] = row
    return out


def _brief(r: dict) -> str:
    if not r["found"]:
        return f"nothing found in {r['examples']} sequences"
    rule = f", rule {' + '.join(r['rule'])}" if r.get("rule") else ""
    return f"first {r['first_s']} s, minimal {r['minimal_s']} s ({r['minimal_steps']} steps){rule}"


def _s(v) -> str:
    return "-" if v is None else f"{v:g}"


def format_hunt_rates(rates: dict) -> str:
    """The table `repro bench --hunt-rates` prints."""
    head = ("hazard", "told first s", "told minimal s", "steps", "blind stack", "blind first s", "blind minimal s",
            "rule named")
    rows = [head]
    notes = []
    for name, r in rates.items():
        if r.get("skipped"):
            notes.append(f"{name}: skipped ({r['skipped']})")
            continue
        t, b = r["told"], r["blind"]
        told = (_s(t["first_s"]), _s(t["minimal_s"]), str(t.get("minimal_steps") or "-")) if t["found"] else \
            (f"none in {t['examples']}", "-", "-")
        if b is None:
            blind = ("n/a", "-", "-", "-")
            notes.append(f"{name}: blind {r.get('blind_why', 'n/a')}")
        elif not b["found"]:
            blind = (b["stack"], f"none in {b['examples']}", "-", "-")
        else:
            blind = (b["stack"], _s(b["first_s"]), _s(b["minimal_s"]), " + ".join(b["rule"] or []) or "none")
        rows.append((name, *told, *blind))
    widths = [max(len(x[i]) for x in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(["hunt rates (seconds from the search's start; told: --hazard on the fixed stack, blind: "
                      "--stack with no hazard)"] + lines + notes)
