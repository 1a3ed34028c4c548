"""The report's standalone script: whether one can be written (the hazard table's `standalone`
flags), its spec (steps, shapes, and the options each knob sets, written in from the table so the
script names nothing by hand), its weights (seeded, or the layer's tensors embedded), and running
it here the way a maintainer would."""
from __future__ import annotations

import enum
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..knobs import hazards as hz
from .standalone.generate import GenerationError, render_script, script_options
from .cases import fixes
from .load import kernel_sentinel, standalone_gap
from ..knobs.modes import Runtime, parse_mode
from ..model.config import TINY
from ..control.dispatch import default_capture_sizes
from ..scheduler.sequence import Sequence
from ..islands import kind
from .standalone.generate import needs

# Largest embedded weights file (a real 35B-A3B layer with all experts is ~0.9 GB: too big to attach).
EMBED_LIMIT = 64 << 20
SCRIPT = "repro_standalone.py"
WEIGHTS = "repro_weights.safetensors"
VERIFY_TIMEOUT = 600


def default_repairs(r: dict) -> list[str]:
    """For `--repair` without a name: the first repair of each hazard the script rebuilds and the
    mode allows; with no hazard planted, the first such fix of the rule a blind hunt blamed
    (`cases.fixes`: vLLM PR #53059's for vLLM #53051's `uniform_decode`)."""
    def usable(name):
        rep = hz.REPAIRS[name]
        return (rep.standalone and rep.leaves == "clean" and name not in r["repairs"]
                and not (rep.piecewise_only and full_decode(r["mode"])))
    if not r["hazards"]:
        return next(([name] for name in fixes(r) if usable(name)), [])
    found = (next((name for name in hz.HAZARDS[h].repairs if usable(name)), None) for h in r["hazards"])
    return [name for name in found if name is not None]


def full_decode(mode: str) -> bool:
    """The mode captures the decode chain as one FULL graph (no family can run eagerly inside it)."""
    return parse_mode(mode).has(Runtime.FULL)


def rules(r: dict) -> dict:
    """The control rules of the stack profile the case ran on, each the template rebuilds (its
    `control.*` options), as its runner reads them; the case's hazards and repairs change them in
    the script, as the spec's knobs say."""
    c = hz.options_for((), (), r.get("stack") or "fixed").control
    names = [k.partition(".")[2] for k in script_options() if k.startswith("control.")]
    return {name: _plain(getattr(c, name)) for name in names}


def _plain(v):
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, (set, frozenset)):
        return sorted(v)
    return v


def knobs() -> dict:
    """The table's standalone rows as the script reads them: the options each sets. A row setting
    an option the template does not rebuild is a table error, refused here."""
    known = set(script_options()) | {"kernel_sentinel"}  # the sentinel is fixed in the spec

    def sets(row) -> dict:
        unknown = set(row.sets) - known
        if unknown:
            raise GenerationError(f"{row.name} is marked standalone but sets {sorted(unknown)}, which the "
                                  "standalone template does not rebuild")
        return {k: _plain(v) for k, v in row.sets.items() if k != "kernel_sentinel"}
    return {"hazards": {h.name: {"sets": sets(h), "replay_only": h.replay_only}
                        for h in hz.HAZARDS.values() if h.standalone},
            "repairs": {x.name: {"sets": sets(x), "piecewise_only": x.piecewise_only}
                        for x in hz.REPAIRS.values() if x.standalone}}


def config_of(model) -> tuple[dict, dict]:
    cfg = model.cfg if model is not None else TINY
    tp = model.tp_size if model is not None else 1
    c = {"hidden": cfg.hidden_size, "hk": cfg.linear_num_key_heads // tp, "hv": cfg.linear_num_value_heads // tp,
         "dk": cfg.linear_key_head_dim, "dv": cfg.linear_value_head_dim, "conv_kernel": cfg.linear_conv_kernel_dim,
         "experts": cfg.num_experts, "top_k": cfg.num_experts_per_tok, "moe_inter": cfg.moe_intermediate_size,
         "shared_inter": cfg.shared_expert_intermediate_size, "vocab": cfg.vocab_size, "eps": cfg.rms_norm_eps,
         "renormalize": bool(cfg.norm_topk_prob)}
    names = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "shared_gate_up", "shared_down")
    if model is None:
        return c, {k: True for k in names + ("experts",)}
    g, m = model.weights.gdn, model.weights.moe
    lins = {**{k: getattr(g, k) for k in names[:5]}, "shared_gate_up": m.shared_gate_up, "shared_down": m.shared_down}
    return c, {**{k: v.quantized for k, v in lins.items()}, "experts": m.experts.quantized}


def embedded_tensors(model, embed_ids) -> dict:
    """The layer's tensors under the script's names (embedding rows only for the ids used)."""
    import torch
    w, head = model.weights, model.head
    g, m = w.gdn, w.moe
    idx = torch.tensor(embed_ids, dtype=torch.long)
    t = {"embed_rows": head.embed_tokens.cpu().index_select(0, idx), "input_layernorm": w.input_layernorm,
         "post_attention_layernorm": w.post_attention_layernorm, "next_norm": model.next_norm,
         "conv1d_weight": g.conv1d_weight.reshape(g.conv1d_weight.shape[0], -1), "A_log": g.A_log,
         "dt_bias": g.dt_bias, "norm_weight": g.norm_weight, "router": m.gate,
         "shared_expert_gate": m.shared_expert_gate, "experts.w13": m.experts.w13, "experts.w2": m.experts.w2}
    if m.experts.quantized:
        t["experts.w13_scale"], t["experts.w2_scale"] = m.experts.w13_scale, m.experts.w2_scale
    for name, lin in (("in_proj_qkv", g.in_proj_qkv), ("in_proj_z", g.in_proj_z), ("in_proj_b", g.in_proj_b),
                      ("in_proj_a", g.in_proj_a), ("out_proj", g.out_proj), ("shared_gate_up", m.shared_gate_up),
                      ("shared_down", m.shared_down)):
        t[name + ".weight"] = lin.weight
        if lin.quantized:
            t[name + ".scale"] = lin.scale
    return {k: v.detach().cpu().contiguous() for k, v in t.items()}


def spec_tokens(r: dict, seqj: dict) -> int:
    """The draft tokens a decode carried in the case (K)."""
    return r.get("spec_tokens") or seqj.get("spec_tokens") or 0


def cache_slots(seqj: dict, k: int) -> int:
    """The requests' worth of 1+K state blocks each copy's cache holds, as the suite built it
    (`Sequence.copy_slots`: more with a block size)."""
    return Sequence([], num_slots=seqj.get("num_slots", 8), spec_tokens=k,
                    block_size=seqj.get("block_size")).copy_slots()


def build_spec(doc, r, steps, seqj, model, sentinel, title, weights) -> dict:
    c, q = config_of(model)
    fd, k = r.get("first_divergence"), spec_tokens(r, seqj)
    return {"title": title, "hazards": list(r["hazards"]), "repairs": list(r["repairs"]),
            "default_repairs": default_repairs(r), "knobs": knobs(),
            "families": sorted(kind(r["island"]).eager),
            "mode": r["mode"], "rules": rules(r), "island": r["island"], "sentinel": kernel_sentinel(r, sentinel),
            "sizes": list(default_capture_sizes(seqj.get("num_slots", 8), seqj.get("max_tokens", 16), k,
                                                rules(r)["decode_capture_sizes"])),
            "spec_tokens": k, "num_slots": seqj.get("num_slots", 8), "block_size": seqj.get("block_size"),
            "cache_slots": cache_slots(seqj, k),
            "max_tokens": max([seqj.get("max_tokens", 16)] + [len(s["token_ids"]) for s in steps]),
            "config": c, "quantised": q, "weights": weights,
            "embed_ids": sorted({t for s in steps for t in s["token_ids"]} | {0}), "steps": steps,
            "expected": fd if r["diverged"] else None,
            "suite": {"device": doc.get("device"), "provider": doc.get("graph_provider"), "torch": doc.get("torch")}}


@dataclass
class Check:
    device: str
    argv: list
    rc: int | None
    result: dict | None
    seconds: float
    tail: str = ""

    def line(self) -> str:
        if self.rc is None:
            return f"did not finish ({self.tail.strip()[-200:]})"
        if self.result and self.result.get("refused"):
            return f"exit {self.rc}: the replay-side assertion refused a FULL replay at step {self.result['step']}"
        if self.result and self.result.get("diverged"):
            r = self.result
            where = f"{r['island']}.{r['tensor']}" + (f" row {r['row']}" if r.get("row") is not None else "") + \
                    (f" slot {r['slot']}" if r.get("slot") is not None else "")
            return f"exit {self.rc}: diverged at step {r['step']} in {where}, max abs diff {r['max_abs']:.4g}"
        return f"exit {self.rc}: replay == eager over every step"


def run_script(folder: Path, device: str, extra=()) -> Check:
    """Run the script as a maintainer would: its own folder, no PYTHONPATH, nothing of this suite."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    argv = [SCRIPT, "--device", device, *extra]
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, *argv], cwd=folder, env=env, capture_output=True, text=True,
                           timeout=VERIFY_TIMEOUT)
    except subprocess.TimeoutExpired:
        return Check(device, argv, None, None, time.perf_counter() - t0, f"timed out after {VERIFY_TIMEOUT} s")
    result = None
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    return Check(device, argv, p.returncode, result, time.perf_counter() - t0, (p.stdout + p.stderr)[-2000:])


def same_place(check: Check, fd: dict | None) -> bool:
    res = check.result or {}
    return bool(fd) and all(res.get(k) == fd.get(k) for k in ("step", "island", "tensor"))


def _verify_device(doc: dict) -> str:
    import torch
    want = {"cuda": "cuda", "xpu": "xpu", "ipex-xpu": "xpu"}.get(str(doc.get("graph_provider")), "cpu")
    if want == "cuda" and torch.cuda.is_available():
        return "cuda"
    if want == "xpu" and getattr(torch, "xpu", None) is not None and torch.xpu.is_available():
        return "xpu"
    return "cpu"


@dataclass
class Standalone:
    generated: bool
    why_not: str = ""
    weights: str = ""  # "seed N" or "embedded"
    needs: str = "only torch"  # what the script imports, in words
    checks: list = field(default_factory=list)  # (label, Check)
    reproduces: bool | None = None
    seed_failed: bool = False
    same_place: bool | None = None
    notes: list = field(default_factory=list)


def make_standalone(folder: Path, doc, r, steps, seqj, model, sentinel, title, verify: bool, seed: int,
                    weights: str = "auto") -> Standalone:
    """Write the script. weights="auto": seeded random weights when the script, run here, gives the
    recorded outcome at the recorded place; else the layer's tensors embedded beside it (when the
    checkpoint is here and small enough). "seed" / "embed" force one."""
    why = standalone_gap(r)
    if why:
        return Standalone(False, why)
    spec = build_spec(doc, r, steps, seqj, model, sentinel, title, {"source": "seed", "seed": seed})
    out = Standalone(True, weights=f"seed {seed}")
    _write(folder, spec, out)
    if weights == "embed":
        _embed(folder, model, spec, out)
    if not verify:
        out.notes.append(f"not run here (--no-verify): the weights are {out.weights} and were not checked")
        return out
    _verify(folder, doc, r, model, spec, out, seed, weights == "auto")
    return out


def _write(folder: Path, spec: dict, out: Standalone) -> None:
    (folder / SCRIPT).write_text(render_script(spec))
    out.needs = needs(spec)


def _embed(folder: Path, model, spec: dict, out: Standalone) -> bool:
    """Write the layer's tensors beside the script and the script to read them; False (and a note why)
    where the checkpoint is not here or the tensors are over what an attachment may take."""
    if model is None:
        out.notes.append("the checkpoint is not readable here: the weights cannot be embedded")
        return False
    tensors = embedded_tensors(model, spec["embed_ids"])
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    if size > EMBED_LIMIT:
        out.notes.append(f"the layer's tensors take {size >> 20} MiB, over the {EMBED_LIMIT >> 20} MiB an "
                         "attachment may take: the weights stay seeded")
        return False
    from safetensors.torch import save_file
    save_file(tensors, str(folder / WEIGHTS))
    os.chmod(folder / WEIGHTS, 0o644)
    spec["weights"] = {"source": "file", "file": WEIGHTS, "bytes": size}
    _write(folder, spec, out)
    out.weights = "embedded"
    return True


def _verify(folder: Path, doc, r, model, spec: dict, out: Standalone, seed: int, auto: bool) -> None:
    """Run the written script here and record what it gives; `auto`: where the seeded weights do not
    give the recorded outcome at the recorded place, embed the layer's and keep whichever came closer."""
    fd = r["first_divergence"] if r["diverged"] else None
    expect_rc = 1 if r["diverged"] else 0

    def faithful(c: Check) -> bool:
        return c.rc == expect_rc and (fd is None or same_place(c, fd))

    device = _verify_device(doc)
    chk = run_script(folder, device)
    out.checks.append((f"as generated, weights {'embedded' if out.weights == 'embedded' else 'from seed'}", chk))
    if auto and not faithful(chk):
        out.seed_failed = True
        if _embed(folder, model, spec, out):
            chk2 = run_script(folder, device)
            out.checks.append(("with the layer's weights embedded", chk2))
            if faithful(chk2) or not chk.rc == expect_rc:
                chk = chk2
            else:  # the seeded weights came closer: back to them
                (folder / WEIGHTS).unlink()
                spec["weights"] = {"source": "seed", "seed": seed}
                _write(folder, spec, out)
                out.weights = f"seed {seed}"
    out.reproduces = chk.rc == expect_rc if chk.rc is not None else None
    out.same_place = faithful(chk) if fd is not None else None
    if spec["default_repairs"] and r["diverged"]:
        label = f"with --repair ({', '.join(spec['default_repairs'])})"
        out.checks.append((label, run_script(folder, device, ["--repair"])))
