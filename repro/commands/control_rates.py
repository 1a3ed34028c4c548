"""`repro bench --hunt-rates --control vllm [--patch FILE ...]`: the time to a blind finding on the
installed vLLM's own decisions, beside the same hunt on the mirror, in one table.

- vllm: `repro hunt --control vllm [--patch ...]` with no hazard (vLLM as installed and patched,
  searched as it is; what it finds is shrunk and blamed on the shipped patches);
- mirror: the blind hunt of the mirror's profile of the same runner (`vllm-0.33-mrv1` for the V1
  runner, `vllm-0.33-mrv2` for V2), with the repairs whose upstream change is a patch applied
  (a repair's `cases` names its pull request: `--repair past-prompt-uniform` for vLLM PR #53059).

Both draw the same sequences (K drafts a decode, 2 unless `--spec-tokens`), at most `examples` of
them each, the shrinking included. Nothing here asserts a timing.
"""
from __future__ import annotations

import re
import tempfile
from pathlib import Path

from ..knobs import hazards as hz
from ..knobs.control import Control
from ..upstream.patches import read
from .hunt import HuntConfig
from .hunt_rates import _row, _s, one

PROFILE = {"v1": "vllm-0.33-mrv1", "v2": "vllm-0.33-mrv2"}


def mirror_repairs(control: Control) -> tuple[str, ...]:
    """The repairs whose upstream change (`Repair.cases`) is the pull request a patch names."""
    out = []
    for p in control.patches:
        pr = re.search(r"PR #(\d+)", read(p).title)
        hit = [r.name for r in hz.REPAIRS.values() if pr and re.search(rf"PR #{pr.group(1)}\b", r.cases)]
        out += [r for r in hit if r not in out]
    return tuple(out)


def control_rates(model: str, device: str, control: Control, examples: int = 20, spec_tokens: int | None = None,
                  quiet: bool = False, log=None, cache=None) -> dict:
    """{"vllm": row, "mirror": row} (module docstring); a row as `hunt_rates._row` makes it, with what
    its blame named."""
    k = 2 if spec_tokens is None else spec_tokens
    base = dict(model=model, device=device, island="chain", spec_tokens=k, max_examples=examples, profile="ci",
                cache=cache)
    stack, repairs = PROFILE[control.runner], mirror_repairs(control)
    out = {"control": control.label(), "mirror_stack": stack, "mirror_repairs": list(repairs), "spec_tokens": k}
    with tempfile.TemporaryDirectory(prefix="repro-control-rates-") as tmp:
        for name, cfg in (("vllm", HuntConfig(control=control.source, patches=control.patches,
                                              save=str(Path(tmp) / "upstream.json"), **base)),
                          ("mirror", HuntConfig(stack=stack, repairs=repairs, save=str(Path(tmp) / "mirror.json"),
                                                **base))):
            stats, doc = one(cfg, quiet)
            row = {**_row(stats, doc), "blame_s": stats.get("blame_s"), "blame": (doc or {}).get("blame")}
            out[name] = row
            if log:
                log(f"  hunt-rates {name}: " + (f"first {row['first_s']} s, minimal {row['minimal_s']} s"
                                               if row["found"] else f"nothing in {row['examples']} sequences"))
    return out


def _named(row: dict) -> str:
    b = row.get("blame") or {}
    if "patches" in b:
        clears = [Path(p).stem for p in b["patches"]["clears"]]
        return "clears: " + (", ".join(clears) or "none (a candidate report)")
    return "rule " + " + ".join(b.get("rules") or []) if b.get("rules") else "-"


def format_control_rates(r: dict) -> str:
    """The one table `repro bench --hunt-rates --control ...` prints."""
    head = ("hunt", "found", "first s", "minimal s", "steps", "sequences", "named")
    rows = [head]
    for name, label in (("vllm", f"--control {r['control']}"),
                        ("mirror", f"--stack {r['mirror_stack']}" + "".join(f" --repair {x}" for x in r["mirror_repairs"]))):
        row = r[name]
        rows.append((label, "yes" if row["found"] else "no", _s(row["first_s"]), _s(row["minimal_s"]),
                     str(row.get("minimal_steps") or "-"), str(row["examples"]), _named(row) if row["found"] else "-"))
    widths = [max(len(x[i]) for x in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([f"hunt rates, blind, K={r['spec_tokens']} (seconds from the search's start): vLLM's own "
                      "decisions beside the mirror's profile of the same runner"] + lines)
