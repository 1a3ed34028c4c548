"""`repro inspect`: what a checkpoint holds - layers and types, quant scheme per module, bytes, problems."""
from __future__ import annotations

import re
from pathlib import Path

from .checkpoint import Checkpoint, QTensor
from .config import GDN
from .quant import BF16, W8A8_INT8
from ..io import wrap

_ALWAYS_BF16 = ("mlp.gate.weight", "mlp.shared_expert_gate.weight")
_SHORT = re.compile(r"^(linear_attn|self_attn|mlp)\.")


def _label(key: str) -> str:
    """Per-expert modules collapse to `experts.*.gate_proj`; block prefixes are dropped."""
    return _SHORT.sub("", re.sub(r"experts\.\d+\.", "experts.*.", key))


def _modules(ck: Checkpoint, specs: dict) -> tuple[dict[str, str], dict[str, int]]:
    """Scheme per (collapsed) module label, and counts of individual modules per scheme."""
    groups: dict[str, set[str]] = {}
    counts = {W8A8_INT8: 0, BF16: 0}
    for key, spec in specs.items():
        if isinstance(spec, QTensor):
            s = ck.quant.scheme_for(spec.module)
        elif key in _ALWAYS_BF16:  # router linears: BF16 whatever the config says (vLLM never quantises them)
            s = BF16
        else:
            continue
        counts[s] += 1
        groups.setdefault(_label(key.removesuffix(".weight")), set()).add(s)
    return {k: (next(iter(v)) if len(v) == 1 else "mixed") for k, v in groups.items()}, counts


def inspect(path: str | Path) -> dict:
    """Describe a checkpoint (raises CheckpointError if it cannot be opened at all)."""
    ck = Checkpoint.open(path)
    c = ck.config
    totals = {W8A8_INT8: 0, BF16: 0}
    layers = []
    for i in range(c.num_hidden_layers):
        mods, counts = _modules(ck, ck.layer_specs(i))
        for k, v in counts.items():
            totals[k] += v
        layers.append({"index": i, "type": c.layer_types[i], "layout": ck.layout(i),
                       "bytes": ck.layer_bytes(i), "modules": mods})
    head_specs = ck.head_specs()
    head_mods, counts = _modules(ck, head_specs)
    for k, v in counts.items():
        totals[k] += v
    problems = ck.check_all()  # reads every float tensor; what loads but looks wrong goes to stats.flags
    head_names = [n for s in head_specs.values() for n in ((s.name,) if not isinstance(s, QTensor) else s.names())]
    return {
        "path": str(ck.path),
        "model_type": c.model_type,
        "multimodal": c.multimodal,
        "prefix": ck.prefix,
        "hidden_size": c.hidden_size,
        "num_layers": c.num_hidden_layers,
        "num_experts": c.num_experts,
        "top_k": c.num_experts_per_tok,
        "files": [f.name for f in ck.files],
        "total_bytes": ck.total_bytes(),
        "ignored_tensors": len(ck.ignored_names()),
        "quantization": {"method": ck.quant.quant_method, "version": ck.quant.version,
                         "description": ck.quant.describe(), "modules": totals},
        "layers": layers,
        "head": {"bytes": sum(ck.info(n).nbytes for n in head_names if ck.has(n)), "modules": head_mods,
                 "tied": "lm_head" not in head_specs},
        "problems": problems,
        "warnings": list(ck.stats.flags),  # loadable but suspicious (zero scales), as `repro run` warns
    }


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def format_inspect(d: dict) -> str:
    """Plain-text description of `inspect`'s result, wrapped at the terminal's width: a row a layer,
    whose module list (the same for most layers) is a numbered note printed once below the table."""
    q = d["quantization"]
    lines = []
    for label, text in (
            ("checkpoint", d["path"]),
            ("model", f"{d['model_type']} ({'multimodal' if d['multimodal'] else 'text-only'}, prefix {d['prefix']}), "
                      f"{d['num_layers']} layers, hidden {d['hidden_size']}, {d['num_experts']} experts top-{d['top_k']}"),
            ("files", f"{len(d['files'])} ({_size(d['total_bytes'])} of text-model tensors; {d['ignored_tensors']} "
                      "visual/mtp tensors ignored)"),
            ("quant", f"{q['description']}; modules: {q['modules'][W8A8_INT8]} W8A8 INT8, {q['modules'][BF16]} BF16")):
        lines += wrap(text, f"{label:<12}")
    lines.append("")
    notes: dict[str, int] = {}

    def note(mods: dict) -> str:
        quant = " ".join(k for k, v in mods.items() if v == W8A8_INT8) or "-"
        rest = " ".join(k for k, v in mods.items() if v != W8A8_INT8) or "-"
        return f"[{notes.setdefault(f'W8A8 INT8: {quant}; BF16: {rest}', len(notes) + 1)}]"
    rows = [("layer", "type", "layout", "bytes", "modules")]
    for lay in d["layers"]:
        layout = "/".join(v for v in (lay["layout"]["gdn"], lay["layout"]["experts"]) if v)
        rows.append((str(lay["index"]), "GDN" if lay["type"] == GDN else "full", layout, _size(lay["bytes"]),
                     note(lay["modules"])))
    h = d["head"]
    rows.append(("head", "", "tied" if h["tied"] else "", _size(h["bytes"]), note(h["modules"])))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    lines.append("")
    for text, n in notes.items():
        lines += wrap(text, f"[{n}] ")
    lines.append("")
    n, w = len(d["problems"]), len(d.get("warnings", []))
    lines.append(f"problems: {n or 'none'}" + (f", warnings: {w}" if w else "") + (" (on stderr)" if n or w else ""))
    return "\n".join(lines)
