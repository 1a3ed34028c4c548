"""A result file (`repro run --json`, `repro hunt`) checked field by field before a report is
written from it, as a `--sequence` file is (`scheduler.schema`): a hand-edited or damaged file is
refused in one line naming the field, never half-reported (a mode of "weird" would otherwise reach
REPORT.md's replay line, a string step a KeyError)."""
from __future__ import annotations

import json

from ..errors import BadInput
from ..islands import ISLANDS
from ..knobs import hazards as hz
from ..knobs.modes import mode_name
from ..knobs.stacks import RULES, STACKS
from ..scheduler.prefix import MAX_BLOCK_SIZE
from ..scheduler.scheduler import MAX_SPEC_TOKENS
from ..scheduler.schema import check_int, check_json

EXPECTS = ("clean", "diverged", "finding")
NON_FINITE = ("inf", "-inf", "nan")  # how strict JSON writes a non-finite float (`io.strict_json`)


def _shown(v) -> str:
    return json.dumps(v)[:40]


def _number(v, src: str, none: bool = True) -> None:
    if (v is None and none) or v in NON_FINITE:
        return
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        raise BadInput(f"{src}: expected a number, got {_shown(v)}")


def _str(v, src: str, choices=None, none: bool = False) -> None:
    if v is None and none:
        return
    if not isinstance(v, str):
        raise BadInput(f"{src}: expected a string, got {_shown(v)}")
    if choices is not None and v not in choices:
        raise BadInput(f"{src}: {v[:40]!r} is not one this suite knows ({', '.join(choices)})")


def _bool(v, src: str, none: bool = False) -> None:
    if not (isinstance(v, bool) or (v is None and none)):
        raise BadInput(f"{src}: expected true or false, got {_shown(v)}")


def _dict(v, src: str, none: bool = False) -> None:
    if not (isinstance(v, dict) or (v is None and none)):
        raise BadInput(f"{src}: expected an object, got {_shown(v)}")


def _names(v, src: str, table) -> None:
    if not isinstance(v, list):
        raise BadInput(f"{src}: expected a list, got {_shown(v)}")
    for i, x in enumerate(v):
        _str(x, f"{src}[{i}]", list(table))


def check_divergence(fd, src: str) -> None:
    """A first divergence: where (step, island, tensor, row, request, slot) and how much (max_abs)."""
    _dict(fd, src)
    for key in ("step", "island", "tensor"):
        if key not in fd:
            raise BadInput(f"{src}: lacks {key}")
    check_int(fd["step"], f"{src}.step", 0)
    _str(fd["island"], f"{src}.island")
    _str(fd["tensor"], f"{src}.tensor")
    for key in ("row", "request", "slot", "rank"):
        check_int(fd.get(key), f"{src}.{key}", -1, none=True)
    _number(fd.get("max_abs"), f"{src}.max_abs")
    _dict(fd.get("context"), f"{src}.context", none=True)


def check_row(r, src: str) -> None:
    """One result row, as `CaseResult.to_json` writes it."""
    _dict(r, src)
    missing = [k for k in ("island", "mode", "hazards", "repairs", "diverged", "first_divergence") if k not in r]
    if missing:
        raise BadInput(f"{src} lacks {', '.join(missing)}")
    _str(r["island"], f"{src}.island", ("chain",) + ISLANDS)
    _str(r["mode"], f"{src}.mode")
    try:
        canonical = mode_name(r["mode"])
    except BadInput as e:
        raise BadInput(f"{src}.mode: {e}") from None
    if canonical != r["mode"]:
        raise BadInput(f"{src}.mode: {_shown(r['mode'])}, but a result spells it {canonical!r}")
    _names(r["hazards"], f"{src}.hazards", hz.HAZARDS)
    _names(r["repairs"], f"{src}.repairs", hz.REPAIRS)
    _bool(r["diverged"], f"{src}.diverged")
    if r["diverged"] or r["first_divergence"] is not None:
        check_divergence(r["first_divergence"], f"{src}.first_divergence")
    if r.get("microscope") is not None:
        check_divergence(r["microscope"], f"{src}.microscope")
    if "steps" in r:
        check_int(r["steps"], f"{src}.steps", 0)
    check_int(r.get("spec_tokens"), f"{src}.spec_tokens", 0, MAX_SPEC_TOKENS, none=True)
    _bool(r.get("data_parallel"), f"{src}.data_parallel", none=True)
    _str(r.get("stack"), f"{src}.stack", list(STACKS), none=True)
    check_int(r.get("block_size"), f"{src}.block_size", 1, MAX_BLOCK_SIZE, none=True)
    _str(r.get("expect", "clean"), f"{src}.expect", EXPECTS)
    for key in ("eager_us", "replay_us"):
        _number(r.get(key), f"{src}.{key}")
    _bool(r.get("strict"), f"{src}.strict", none=True)
    _bool(r.get("triggered"), f"{src}.triggered", none=True)
    findings = r.get("findings", [])
    if not isinstance(findings, list):
        raise BadInput(f"{src}.findings: expected a list, got {_shown(findings)}")
    for i, f in enumerate(findings):
        _dict(f, f"{src}.findings[{i}]")
        _str(f.get("kind"), f"{src}.findings[{i}].kind")
        _str(f.get("detail"), f"{src}.findings[{i}].detail")
    _dict(r.get("kernel_findings"), f"{src}.kernel_findings", none=True)
    for kind, v in (r.get("kernel_findings") or {}).items():
        _dict(v, f"{src}.kernel_findings.{kind}")
        check_int(v.get("count"), f"{src}.kernel_findings.{kind}.count", 1)
        check_divergence(v.get("first"), f"{src}.kernel_findings.{kind}.first")
    if "sequence" in r:
        check_json(r["sequence"], f"{src}.sequence")


def check_blame(b, src: str) -> None:
    """A blind hunt's blame (`search.blind.blame_json`): the rules at fault, the record hazards that
    set them, their upstream issues, the reruns made."""
    _dict(b, src)
    _names(b.get("rules"), f"{src}.rules", RULES)
    _names(b.get("hazards"), f"{src}.hazards", hz.HAZARDS)
    _str(b.get("upstream", ""), f"{src}.upstream")
    check_int(b.get("tried", 0), f"{src}.tried", 0)


def check_document(doc, name: str) -> None:
    """The whole file: its own fields, every row, the sequence and a blind hunt's blame."""
    for key in ("device", "graph_provider", "torch", "checkpoint", "command", "replay"):
        _str(doc.get(key), f"{name}: {key}", none=True)
    _str(doc.get("stack"), f"{name}: stack", list(STACKS), none=True)
    for key in ("kernel_sentinel", "sentinel"):
        check_int(doc.get(key), f"{name}: {key}", -1, 0, none=True)
    check_int(doc.get("spec_tokens"), f"{name}: spec_tokens", 0, MAX_SPEC_TOKENS, none=True)
    _bool(doc.get("data_parallel"), f"{name}: data_parallel", none=True)
    check_int(doc.get("layer"), f"{name}: layer", 0, none=True)
    check_int(doc.get("seed"), f"{name}: seed", none=True)
    for i, r in enumerate(doc["results"]):
        check_row(r, f"{name}: results[{i}]")
    key = "minimal_sequence" if "minimal_sequence" in doc else "sequence"
    if not isinstance(doc.get(key), dict):
        raise BadInput(f"{name} has no request sequence (`sequence` or `minimal_sequence`)")
    check_json(doc[key], f"{name}: {key}")
    if doc.get("blame") is not None:
        check_blame(doc["blame"], f"{name}: blame")
