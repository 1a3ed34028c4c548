"""`repro report RESULT.json -o DIR`: a bug report an upstream maintainer can act on.

DIR gets `REPORT.md` (what ran where, expected vs actual, the minimal request sequence, the
first divergence under the microscope, which repairs clear it and what they cost, public cases),
`env.txt` (this machine: torch build, devices and drivers, IPEX, oneCCL/XCCL, Triton, FLA, OS,
Python), `sequence.json` (replayable with `repro run --sequence`), `result.json` (the input) and
`repro_standalone.py`: one script needing only torch that rebuilds the failing islands and
reproduces the divergence (exit 1) or not (exit 0). Weights in the script are regenerated from a
seed when that reproduces the recorded divergence (checked here by running the script), else the
layer's tensors are embedded beside it as `repro_weights.safetensors`.

The directory is written atomically: everything goes to a temporary directory beside DIR, which
is renamed into place only when complete.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from . import hazards as hz
from .errors import BadInput, Refused

# Hazards the standalone script reproduces (the mechanism is rebuilt in plain torch there).
STANDALONE_HAZARDS = ("stale-pad", "pad-sentinel-mismatch", "frozen-python-state", "fresh-alloc-split-op")
STANDALONE_REPAIRS = ("sanitize-pad", "recapture", "copy-inputs", "eager-family=moe", "eager-family=submod0",
                      "eager-family=submod1")
STANDALONE_ISLANDS = ("chain", "submod0", "submod1", "gdn_core")
# Largest embedded weights file (a real 35B-A3B layer with all experts is ~0.9 GB: too big to attach).
EMBED_LIMIT = 64 << 20
SCRIPT = "repro_standalone.py"
WEIGHTS = "repro_weights.safetensors"
VERIFY_TIMEOUT = 600

ISSUE_URLS = {
    "vLLM": "https://github.com/vllm-project/vllm/issues/{}",
    "PyTorch": "https://github.com/pytorch/pytorch/issues/{}",
    "torch-xpu-ops": "https://github.com/intel/torch-xpu-ops/issues/{}",
    "auto-round": "https://github.com/intel/auto-round/issues/{}",
}
# What each public case shows (DESIGN.md), so a reader knows why it is cited.
CASE_NOTES = {
    ("vLLM", "37363"): "a splitting op returns a fresh tensor: the next graph reads a stale input address",
    ("vLLM", "37361"): "a splitting op returns a fresh tensor: the next graph reads a stale input address",
    ("vLLM", "37395"): "a splitting op returns a fresh tensor: the next graph reads a stale input address",
    ("vLLM", "53915"): "a splitting op returns a fresh tensor: the next graph reads a stale input address",
    ("vLLM", "35431"): "pad sentinel moved from -1 to 0; kernels had to learn to skip 0",
    ("vLLM", "39064"): "pad sentinel moved from -1 to 0; kernels had to learn to skip 0",
    ("vLLM", "37728"): "Mamba state corrupted by stale block-table entries with FULL graphs",
    ("vLLM", "51928"): "XPU GDN moved outside the graph: frozen state addressing corrupted Qwen3.5",
    ("vLLM", "48327"): "XPU graph gibberish at TP2 on B70",
    ("vLLM", "48946"): "XPU graph gibberish on PVC",
    ("PyTorch", "189403"): "a captured all-reduce replayed, then an eager all-reduce gives NaN on XPU",
    ("PyTorch", "196490"): "SYCL graph capture does not follow other queues",
    ("PyTorch", "122192"): "stale outputs on the replay path",
    ("PyTorch", "114844"): "Python-side state changed during capture is not replayed",
    ("torch-xpu-ops", "2992"): "XCCL capture needs oneCCL >= 2021.17.2",
    ("auto-round", "2206"): "a oneDNN matmul on a cached stream was never recorded: every replay returned zeros",
}
# Cited for a divergence with no planted hazard (the upstream bug itself), by device.
BASELINE_CASES = {
    "xpu": "vLLM 48327, 48946, 51928, PyTorch 196490, torch-xpu-ops 2992",
    "ipex-xpu": "vLLM 48327, 48946, 51928, PyTorch 196490, torch-xpu-ops 2992",
    "cuda": "PyTorch 122192, vLLM 37728",
}


# ----------------------------------------------------------------------------- input

def load_result(path) -> dict:
    """Read and check a result file from `repro run --json` or `repro hunt`; BadInput if unusable."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise BadInput(f"result file {path} does not exist") from None
    except OSError as e:
        raise BadInput(f"cannot read result file {path}: {e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadInput(f"result file {path} is not JSON ({e})") from None
    check_result(doc, str(path))
    return doc


def check_result(doc, name: str = "the result") -> None:
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list) or not doc["results"]:
        raise BadInput(f"{name} is not a `repro run --json` / `repro hunt` result: it needs a non-empty `results` list")
    for i, r in enumerate(doc["results"]):
        missing = [k for k in ("island", "mode", "hazards", "repairs", "diverged", "first_divergence") if
                   not isinstance(r, dict) or k not in r]
        if missing:
            raise BadInput(f"{name}: results[{i}] lacks {', '.join(missing)}")
        fd = r["first_divergence"]
        if r["diverged"] and not (isinstance(fd, dict) and "step" in fd):
            raise BadInput(f"{name}: results[{i}] diverged but has no first_divergence.step")
    if not isinstance(doc.get("minimal_sequence", doc.get("sequence")), dict):
        raise BadInput(f"{name} has no request sequence (`sequence` or `minimal_sequence`)")


def pick(doc: dict, index: int | None = None) -> int:
    """The result the report is about: `index`, else the first unexpected divergence (an upstream
    bug), else the first divergence, else the first result."""
    rs = doc["results"]
    if index is not None:
        if not 0 <= index < len(rs):
            raise BadInput(f"--case {index}: the result file has {len(rs)} results (0..{len(rs) - 1})")
        return index
    for i, r in enumerate(rs):
        if r["diverged"] and r.get("expect", "clean") == "clean":
            return i
    for i, r in enumerate(rs):
        if r["diverged"]:
            return i
    return 0


# ----------------------------------------------------------------------------- the steps that ran

def _kernel_sentinel(r: dict, sentinel: int | None) -> int:
    return -1 if "pad-sentinel-mismatch" in r["hazards"] else (sentinel if sentinel is not None else 0)


def _matches(step: dict, ctx: dict) -> bool:
    return all(step.get(a) == ctx.get(b) for a, b in (("request_ids", "requests"), ("slots", "slots"),
                                                      ("query_lens", "query_lens")) if b in ctx)


def steps_that_ran(doc: dict, r: dict, sentinel: int | None):
    """(steps, sequence json, source): the steps `run_case` fed the lockstep for result `r`.

    A hunt's `minimal_sequence` carries them. `repro run --json` writes its sequence's steps as
    scheduled for the default slot range, while a run whose kernel sentinel is -1 used slots
    0..N-1: the candidate whose divergent step matches the microscope's context is taken."""
    from .sequence import Sequence
    seqj = doc.get("minimal_sequence") or doc["sequence"]
    source = "hunt (shrunk by Hypothesis)" if "minimal_sequence" in doc else "run"
    seq = Sequence.from_json(seqj)
    explicit = [dict(s) for s in seq.steps]
    candidates = [explicit] if explicit else []
    if seq.requests:
        bare = dataclasses.replace(seq, steps=[])
        scheduled = [b.to_json() for b in bare.batches(
            None if _kernel_sentinel(r, sentinel) == 0 else range(seq.num_slots))]
        if "minimal_sequence" not in doc and _kernel_sentinel(r, sentinel) != 0:
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
            chosen = chosen[:k + 1]
    out = {k: seqj[k] for k in ("num_slots", "max_tokens", "vocab", "seed") if k in seqj}
    used = {rid for s in chosen for rid in s["request_ids"]}
    out["requests"] = [q for q in seqj.get("requests", []) if q.get("rid") in used]
    out["steps"] = chosen
    return chosen, out, source


# ----------------------------------------------------------------------------- repairs

@dataclass
class RepairRow:
    repair: str
    diverged: bool | None
    replay_us: float | None
    without_us: float | None
    source: str
    note: str = ""

    @property
    def cost(self) -> float | None:
        if self.replay_us and self.without_us:
            return self.replay_us / self.without_us
        return None


def repair_rows(doc: dict, r: dict, steps, seqj, model, sentinel: int | None) -> list[RepairRow]:
    """Repairs of the planted hazards: from the result when it has them, else run here on the CPU."""
    rows: list[RepairRow] = []
    same = [x for x in doc["results"] if x["island"] == r["island"] and x["mode"] == r["mode"]
            and x["hazards"] == r["hazards"] and x["repairs"] and x is not r]
    for x in same:
        rows.append(RepairRow(",".join(x["repairs"]), x["diverged"], x.get("replay_us"), r.get("replay_us"),
                              f"result file ({doc.get('graph_provider', '?')})"))
    if not r["hazards"]:
        return rows
    wanted = []
    for h in r["hazards"]:
        if h not in hz.HAZARDS:
            continue
        for rep in hz.HAZARDS[h].repairs:
            if rep in r["repairs"] or any(rep in row.repair.split(",") for row in rows) or rep in wanted:
                continue
            wanted.append(rep)
    if not wanted:
        return rows
    if model is None:
        for rep in wanted:
            rows.append(RepairRow(rep, None, None, None, "not run", "checkpoint not found here"))
        return rows
    if r["island"] in ("moe", "forced_comm"):
        for rep in wanted:
            rows.append(RepairRow(rep, None, None, None, "not run", f"island {r['island']}: run it with `repro run`"))
        return rows
    from .graphs import TapeProvider
    from .job import Case, run_case
    from .sequence import Sequence
    provider = TapeProvider("cpu")
    seq = Sequence(requests=[], num_slots=seqj.get("num_slots", 8), max_tokens=seqj.get("max_tokens", 16),
                   vocab=seqj.get("vocab", 512), seed=seqj.get("seed", 0), steps=steps)
    sent = sentinel if sentinel is not None else 0
    base = run_case(model, provider, Case(r["island"], r["mode"], tuple(r["hazards"]), tuple(r["repairs"])), seq,
                    sentinel=sent)
    for rep in wanted:
        try:
            hz.check(r["hazards"], list(r["repairs"]) + [rep], r["mode"], provider.supports_streams,
                     r["island"] if r["island"] == "moe" else "chain")
        except Refused as e:
            rows.append(RepairRow(rep, None, None, None, "refused", str(e)))
            continue
        res = run_case(model, provider, Case(r["island"], r["mode"], tuple(r["hazards"]),
                                             tuple(r["repairs"]) + (rep,)), seq, sentinel=sent)
        rows.append(RepairRow(rep, res.detected, res.replay_us, base.replay_us,
                              "run here (cpu-tape, same steps)"))
    return rows


# ----------------------------------------------------------------------------- environment

def _drivers() -> list[str]:
    import torch
    lines = []

    def guard(fn, default="?"):
        try:
            return fn()
        except Exception:  # noqa: BLE001 - the report must never fail on a probe
            return default

    if guard(torch.cuda.is_available, False):
        drv = guard(lambda: subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=20).stdout.split()[0])
        for i in range(torch.cuda.device_count()):
            pr = torch.cuda.get_device_properties(i)
            lines.append(f"cuda:{i}      {pr.name}, cc {pr.major}.{pr.minor}, {pr.total_memory >> 20} MiB, "
                         f"driver {drv}, CUDA runtime {torch.version.cuda}")
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and guard(xpu.is_available, False):
        for i in range(xpu.device_count()):
            pr = xpu.get_device_properties(i)
            lines.append(f"xpu:{i}       {getattr(pr, 'name', '?')}, driver {getattr(pr, 'driver_version', '?')}, "
                         f"{getattr(pr, 'total_memory', 0) >> 20} MiB")
    cpu = guard(lambda: next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                             if line.startswith("model name")), platform.processor() or "?")
    lines.append(f"cpu         {cpu}, {os.cpu_count()} logical cores")
    return lines


def environment_text(doc: dict) -> str:
    from .env import environment, format_env
    lines = ["# Environment of the machine that wrote this report (`repro env`)", "",
             format_env(environment()), "devices and drivers"]
    lines += [f"  {x}" for x in _drivers()]
    lines += [f"os          {platform.platform()}", f"python      {sys.version.split()[0]} ({sys.executable})", "",
              "# Where the result was produced (from the result file)",
              f"device      {doc.get('device', '?')}", f"provider    {doc.get('graph_provider', '?')}",
              f"torch       {doc.get('torch', '?')}", f"checkpoint  {doc.get('checkpoint', '?')}"]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the standalone script

def standalone_gap(r: dict) -> str | None:
    """Why no standalone script can be generated for result `r` (None: it can)."""
    if r["island"] not in STANDALONE_ISLANDS:
        return f"island {r['island']} is not rebuilt by the standalone script yet (it covers the GDN layer chain)"
    bad = [h for h in r["hazards"] if h not in STANDALONE_HAZARDS]
    if bad:
        return (f"hazard {', '.join(bad)}: no standalone script is generated for it yet (the script reproduces "
                f"{', '.join(STANDALONE_HAZARDS)} and baseline divergences)")
    bad = [x for x in r["repairs"] if x not in STANDALONE_REPAIRS]
    if bad:
        return f"repair {', '.join(bad)} is not rebuilt by the standalone script yet"
    return None


def _island_repairs(island: str) -> list[str]:
    from .job import ISLAND_MODES
    return list(ISLAND_MODES.get(island, ("", ()))[1])


def _default_repairs(r: dict) -> list[str]:
    out = []
    for h in r["hazards"]:
        for rep in hz.HAZARDS[h].repairs:
            if rep in STANDALONE_REPAIRS and rep not in r["repairs"]:
                if rep.startswith("eager-family=") and r["mode"] == "full":
                    continue
                out.append(rep)
                break
    return out


def _config_of(model):
    from .config import TINY
    cfg = model.cfg if model is not None else TINY
    w = model.weights if model is not None else None
    c = {"hidden": cfg.hidden_size, "hk": cfg.linear_num_key_heads // (model.tp_size if model else 1),
         "hv": cfg.linear_num_value_heads // (model.tp_size if model else 1), "dk": cfg.linear_key_head_dim,
         "dv": cfg.linear_value_head_dim, "conv_kernel": cfg.linear_conv_kernel_dim, "experts": cfg.num_experts,
         "top_k": cfg.num_experts_per_tok, "moe_inter": cfg.moe_intermediate_size,
         "shared_inter": cfg.shared_expert_intermediate_size, "vocab": cfg.vocab_size, "eps": cfg.rms_norm_eps,
         "renormalize": bool(cfg.norm_topk_prob)}
    if w is None:
        q = {k: True for k in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj", "shared_gate_up",
                               "shared_down", "experts")}
    else:
        g, m = w.gdn, w.moe
        q = {"in_proj_qkv": g.in_proj_qkv.quantized, "in_proj_z": g.in_proj_z.quantized,
             "in_proj_b": g.in_proj_b.quantized, "in_proj_a": g.in_proj_a.quantized, "out_proj": g.out_proj.quantized,
             "shared_gate_up": m.shared_gate_up.quantized, "shared_down": m.shared_down.quantized,
             "experts": m.experts.quantized}
    return c, q


def _embedded_tensors(model, embed_ids) -> dict:
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


def build_spec(doc, r, steps, seqj, model, sentinel, title, weights) -> dict:
    c, q = _config_of(model)
    hazards = list(r["hazards"])
    repairs = list(dict.fromkeys(list(r["repairs"]) + _island_repairs(r["island"])))
    mode = r["mode"]
    embed_ids = sorted({t for s in steps for t in s["token_ids"]} | {0})
    from .runner import DEFAULT_SIZES
    fd = r.get("first_divergence")
    return {"title": title, "hazards": hazards, "repairs": repairs, "default_repairs": _default_repairs(r),
            "mode": mode, "island": r["island"], "sentinel": _kernel_sentinel(r, sentinel),
            "sizes": list(DEFAULT_SIZES), "num_slots": seqj.get("num_slots", 8),
            "max_tokens": max([seqj.get("max_tokens", 16)] + [len(s["token_ids"]) for s in steps]),
            "config": c, "quantised": q, "weights": weights, "embed_ids": embed_ids, "steps": steps,
            "expected": fd if r["diverged"] else None,
            "suite": {"device": doc.get("device"), "provider": doc.get("graph_provider"), "torch": doc.get("torch")}}


def render_script(spec: dict) -> str:
    template = (Path(__file__).parent / "standalone" / "gdn_chain.py").read_text()
    marker = "SPEC_JSON = None  # @SPEC@ (filled in by `repro report`)"
    if marker not in template or "@TITLE@" not in template:
        raise RuntimeError("the standalone template lost its markers")
    text = template.replace(marker, "SPEC_JSON = " + repr(json.dumps(spec, separators=(",", ":"))))
    return text.replace("@TITLE@", spec["title"].replace('"""', "'''"), 1)


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


def _same_place(check: Check, fd: dict | None) -> bool:
    res = check.result or {}
    return bool(fd) and res.get("step") == fd.get("step") and res.get("island") == fd.get("island") \
        and res.get("tensor") == fd.get("tensor")


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
    fd = r["first_divergence"] if r["diverged"] else None
    expect_rc = 1 if r["diverged"] else 0
    script = folder / SCRIPT
    spec = build_spec(doc, r, steps, seqj, model, sentinel, title, {"source": "seed", "seed": seed})
    out = Standalone(True, weights=f"seed {seed}")

    def faithful(c: Check) -> bool:
        return c.rc == expect_rc and (fd is None or _same_place(c, fd))

    def embed() -> bool:
        if model is None:
            out.notes.append("the checkpoint is not readable here: the weights cannot be embedded")
            return False
        tensors = _embedded_tensors(model, spec["embed_ids"])
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        if size > EMBED_LIMIT:
            out.notes.append(f"the layer's tensors take {size >> 20} MiB, over the {EMBED_LIMIT >> 20} MiB an "
                             "attachment may take: the weights stay seeded")
            return False
        from safetensors.torch import save_file
        save_file(tensors, str(folder / WEIGHTS))
        os.chmod(folder / WEIGHTS, 0o644)
        spec["weights"] = {"source": "file", "file": WEIGHTS, "bytes": size}
        script.write_text(render_script(spec))
        out.weights = "embedded"
        return True

    script.write_text(render_script(spec))
    if weights == "embed":
        embed()
    if not verify:
        out.notes.append(f"not run here (--no-verify): the weights are {out.weights} and were not checked")
        return out
    device = _verify_device(doc)
    chk = run_script(folder, device)
    out.checks.append((f"as generated, weights {'embedded' if out.weights == 'embedded' else 'from seed'}", chk))
    if weights == "auto" and not faithful(chk):
        out.seed_failed = True
    if weights == "auto" and not faithful(chk) and embed():
        chk2 = run_script(folder, device)
        out.checks.append(("with the layer's weights embedded", chk2))
        if faithful(chk2) or not chk.rc == expect_rc:
            chk = chk2
        else:  # the seeded weights came closer: back to them
            (folder / WEIGHTS).unlink()
            spec["weights"] = {"source": "seed", "seed": seed}
            script.write_text(render_script(spec))
            out.weights = f"seed {seed}"
    out.reproduces = chk.rc == expect_rc if chk.rc is not None else None
    out.same_place = faithful(chk) if fd is not None else None
    if spec["default_repairs"] and r["diverged"]:
        label = f"with --repair ({', '.join(spec['default_repairs'])})"
        out.checks.append((label, run_script(folder, device, ["--repair"])))
    return out


# ----------------------------------------------------------------------------- Markdown

def _cases(text: str) -> list[tuple[str, str, str | None]]:
    """'vLLM 35431, 39064, PyTorch 1' -> [(project, number, url)]; free text stays as is."""
    out, project = [], None
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        m = re.fullmatch(r"(vLLM|PyTorch|torch-xpu-ops|auto-round)?\s*(\d+)", part)
        if m and (m.group(1) or project):
            project = m.group(1) or project
            out.append((project, m.group(2), ISSUE_URLS[project].format(m.group(2))))
        else:
            out.append((part, "", None))
            project = None
    return out


def _fmt_us(x) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _code(text: str, lang: str = "") -> str:
    return f"```{lang}\n{text}\n```"


def _explain(r: dict, fd: dict | None, sentinel: int) -> list[str]:
    """What the mechanism did in this very case, in the microscope's terms."""
    if fd is None:
        return []
    ctx = (r.get("microscope") or {}).get("context", {})
    this, prev = ctx.get("this_step", {}), ctx.get("previous_step", {})
    pads = this.get("pad_state_indices")
    out = []
    hs = r["hazards"]
    if "stale-pad" in hs and pads is not None:
        out.append(f"Step {this.get('step')} had {len(this.get('slots', []))} live decode rows padded to "
                   f"{this.get('padded_to')}. The padded rows' state indices were {pads} and their token ids "
                   f"{this.get('pad_input_ids')}: values left in the persistent buffers by step {prev.get('step')} "
                   f"(slots {prev.get('slots')}, query lens {prev.get('query_lens')}), not the sentinel {sentinel}. "
                   "The captured GDN decode treated them as live rows and wrote their state into slot "
                   f"{fd.get('slot')} "
                   f"(the last writer of a slot wins), clobbering request {fd.get('request')}'s {fd.get('tensor')}.")
    if "pad-sentinel-mismatch" in hs and pads is not None:
        out.append(f"The runner padded the state indices with {pads[:1] or ['?']} while the kernel skips only "
                   f"{sentinel}: the padded rows of step {this.get('step')} (padded to {this.get('padded_to')}) "
                   f"were live rows for slot {fd.get('slot')}, a real slot here, and overwrote its "
                   f"{fd.get('tensor')}.")
    if "frozen-python-state" in hs:
        details = [f["detail"] for f in r.get("findings", []) if f.get("kind") == "python-state"]
        details.sort(key=lambda d: f"size {this.get('padded_to')} " not in d)  # this step's size first
        out.append(f"The MoE trims its rows to the forward context's `num_actual_tokens`, a Python int read while "
                   f"the graph was captured. At step {fd.get('step')} the step had {sum(this.get('query_lens', []))} "
                   f"tokens but the replay used the frozen count, so row {fd.get('row')} of "
                   f"{fd.get('island')}.{fd.get('tensor')} differs."
                   + (f" Capture-time finding: {details[0]}" if details else ""))
    if "fresh-alloc-split-op" in hs:
        out.append("The eager splitting op (`gdn_core`) returned a freshly allocated `core_out` instead of writing "
                   "the buffer graph 1 was captured with; the replayed graph 1 read the captured address, which "
                   f"holds stale bytes, so {fd.get('island')}.{fd.get('tensor')} row {fd.get('row')} differs.")
    if not hs:
        out.append("No hazard was planted: the runner pads with the kernel's sentinel, keeps the splitting op's "
                   "outputs in place and recaptures nothing. A divergence here is a defect of the graph stack "
                   "(capture, replay, pool or kernels under capture) on this device: the upstream bug.")
    return out


def render_markdown(doc, r, idx, steps, seqj, source, rows, sa: Standalone, notes, command, result_path,
                    replay_cmd, title, sentinel, layer, model_here: bool = True) -> str:
    fd = r["first_divergence"] if r["diverged"] else None
    micro = r.get("microscope") or fd or {}
    L = [f"# {title}", ""]
    planted = bool(r["hazards"])
    if planted:
        mech = "; ".join(f"`{h}`: {hz.HAZARDS[h].mechanism}" for h in r["hazards"] if h in hz.HAZARDS)
        L += [f"> Planted hazard. The suite planted {mech}. The divergence below is that mechanism caught in the "
              "act; the report shows how a serving stack runs into it and what clears it.", ""]
    elif r["diverged"]:
        L += ["> **No hazard planted: replay differs from eager at baseline.** This is the defect to report "
              "upstream.", ""]
    L += ["| | |", "| --- | --- |",
          f"| island | `{r['island']}` |", f"| capture mode | `{r['mode']}` |",
          f"| hazard | {', '.join(f'`{h}`' for h in r['hazards']) or 'none (baseline)'} |",
          f"| repairs applied | {', '.join(f'`{x}`' for x in r['repairs']) or 'none'} |",
          f"| graph provider | `{doc.get('graph_provider', '?')}` on {doc.get('device', '?')} |",
          f"| torch | {doc.get('torch', '?')} |",
          f"| checkpoint | `{doc.get('checkpoint', '?')}` "
          f"(layer: {layer if layer is not None else 'the first GDN layer'}) |",
          f"| kernel pad sentinel | {sentinel} |",
          f"| outcome | {('diverged at step ' + str(fd['step'])) if fd else 'clean'} (expected "
          f"{'for this planted hazard' if planted else 'of a healthy stack'}: {r.get('expect', 'clean')}) |",
          f"| result | `{result_path or 'in memory'}`, results[{idx}] of {len(doc['results'])} |", ""]

    from .env import environment
    env = environment()
    t = env["torch"]
    dev = env["devices"]
    gp = [f"{k} ({v['detail']})" for k, v in env["graph_providers"].items() if v["available"]]
    pk = env["packages"]
    L += ["## Environment", "",
          f"- result produced with torch {doc.get('torch', '?')}, provider `{doc.get('graph_provider', '?')}` "
          f"on {doc.get('device', '?')}",
          f"- this report written on: torch {t['version']} ({t['build']}), Python {env['python']}, {env['os']}",
          f"- devices here: CUDA {dev['cuda']['count']} ({', '.join(dev['cuda']['names']) or '-'}), "
          f"XPU {dev['xpu']['count']} ({', '.join(dev['xpu']['names']) or '-'}); graphs: {', '.join(gp)}",
          f"- IPEX {pk.get('intel_extension_for_pytorch')}, oneCCL bindings {pk.get('oneccl_bindings_for_pytorch')}, "
          f"XCCL {'yes' if env['distributed']['xccl'] else 'no'}, Triton {pk.get('triton')}, FLA {pk.get('fla')}",
          "- everything, drivers included: [`env.txt`](env.txt)", ""]

    L += ["## What was run", ""]
    if command:
        L += ["The command that produced this result:", "", _code(command, "sh"), ""]
    else:
        L += ["The result file does not record its command line; this replays the same case:", ""]
    L += ["Replay exactly this case with the suite (the steps are in `sequence.json`):", "",
          _code(replay_cmd, "sh"), ""]
    if sa.generated:
        L += ["Or with nothing but torch:", "", _code(f"python {SCRIPT}            # exit 1: reproduced, 0: not"
                                                       + (f"\npython {SCRIPT} --repair   # with "
                                                          f"{', '.join(_default_repairs(r))}"
                                                          if _default_repairs(r) else ""), "sh"), ""]

    L += ["## Expected vs actual", "",
          "- **Expected:** graph replay computes exactly what eager computes: every island output of every live "
          "row, the state rows of every slot the step touches and the canary token ids are equal bit for bit at "
          "every step (they are on the CPU tape and on CUDA at baseline).",
          ]
    if fd:
        L.append(f"- **Actual:** step {fd['step']}: `{fd['island']}.{fd['tensor']}`"
                 + (f" row {fd['row']}" if fd.get("row") is not None else "")
                 + (f" (request {fd.get('request')}, slot {fd.get('slot')})" if fd.get("slot") is not None else "")
                 + f" differs, max |eager - replay| = {fd['max_abs']:.4g}, after {r.get('steps', '?')} steps.")
    else:
        L.append(f"- **Actual:** replay equals eager bit for bit over {r.get('steps', '?')} steps.")
    if r.get("findings"):
        L.append("- Findings of the capture-time lint: " + "; ".join(f"{f['kind']} ({f['island']}): {f['detail']}"
                                                                      for f in r["findings"]))
    L.append("")

    L += ["## Minimal request sequence", ""]
    if source.startswith("hunt"):
        L.append(f"Shrunk by `repro hunt` to {len(seqj.get('requests', []))} requests and {len(steps)} steps.")
    else:
        L.append(f"The steps of the run up to and including the first divergent step ({len(steps)} steps, "
                 f"{len(seqj.get('requests', []))} requests); `repro hunt` shrinks further.")
    L += ["", "| request | prompt tokens | decode steps | arrives at step | preempted after |",
          "| --- | --- | --- | --- | --- |"]
    for q in seqj.get("requests", []):
        L.append(f"| {q['rid']} | {q['prompt_len']} | {q['decode_steps']} | {q.get('arrive', 0)} | "
                 f"{q.get('preempt_after') if q.get('preempt_after') is not None else '-'} |")
    L += ["", "| step | requests | slots | query lens | has initial state | tokens | kind |",
          "| --- | --- | --- | --- | --- | --- | --- |"]
    for s in steps:
        kind = "decode" if all(q == 1 for q in s["query_lens"]) and all(s["has_initial_state"]) else "mixed/prefill"
        L.append(f"| {s['step']} | {s['request_ids']} | {s['slots']} | {s['query_lens']} | "
                 f"{[int(b) for b in s['has_initial_state']]} | {len(s['token_ids'])} | {kind} |")
    L.append("")

    L += ["## First divergence", ""]
    if fd:
        ctx = micro.get("context", {})
        this, prev = ctx.get("this_step", {}), ctx.get("previous_step", {})
        L += [f"- where: step {fd['step']}, island `{fd['island']}`, tensor `{fd['tensor']}`"
              + (f", row {fd['row']}" if fd.get("row") is not None else "")
              + f", request {fd.get('request')}, slot {fd.get('slot')}, max abs diff {fd['max_abs']:.4g}"]
        if this:
            L.append(f"- this step: requests {this.get('requests')}, slots {this.get('slots')}, query lens "
                     f"{this.get('query_lens')}, has initial state {this.get('has_initial_state')}, token digest "
                     f"`{this.get('token_ids')}`"
                     + (f"; padded to {this['padded_to']}: padded rows' state indices {this.get('pad_state_indices')}, "
                        f"input ids {this.get('pad_input_ids')}" if this.get("padded_to") else ""))
        if prev:
            L.append(f"- previous step: requests {prev.get('requests')}, slots {prev.get('slots')}, query lens "
                     f"{prev.get('query_lens')}, has initial state {prev.get('has_initial_state')}")
        ed, rd = ctx.get("eager_digest", {}), ctx.get("replay_digest", {})
        if ed:
            L += ["", "Digests of the step's outputs (live rows):", "", "| tensor | eager | replay | |",
                  "| --- | --- | --- | --- |"]
            for k in ed:
                L.append(f"| `{k}` | `{ed[k]}` | `{rd.get(k)}` | {'differs' if ed[k] != rd.get(k) else ''} |")
            if fd["tensor"] in ("conv_state", "ssm_state"):
                L.append(f"\nEvery output agrees; the state row of slot {fd.get('slot')} does not, so the error "
                         "surfaces at a later step, in the output of whichever request reads that slot next.")
        L.append("")
        L += _explain(r, fd, sentinel)
    else:
        L.append("None: no step diverged.")
    L.append("")

    L += ["## Repairs", ""]
    if rows:
        L += ["| repair | clears it | replay µs/step with | without | cost (with / without) | measured |",
              "| --- | --- | --- | --- | --- | --- |"]
        for row in rows:
            clears = "-" if row.diverged is None else ("no" if row.diverged else "yes")
            cost = f"{row.cost:.2f}x" if row.cost else "-"
            L.append(f"| `{row.repair}` | {clears} | {_fmt_us(row.replay_us)} | {_fmt_us(row.without_us)} | {cost} | "
                     f"{row.source}{': ' + row.note if row.note else ''} |")
        if any(row.cost for row in rows) and doc.get("graph_provider") == "cpu-tape" or \
                any(row.cost and row.source.startswith("run here") for row in rows):
            L += ["", "Costs on the CPU tape measure the emulation, not a device: read them as relative, and rerun "
                  "`repro run --device DEV --hazard H --repair R --sequence sequence.json` on the device for "
                  "real numbers."]
    elif planted:
        L.append("No repair is known for this hazard.")
    elif not r["diverged"]:
        L.append("Nothing diverged: no repair is needed.")
    else:
        L.append("Nothing was planted, so there is no hazard-specific repair. On the device, try the runner-side "
                 "repairs (`sanitize-pad`, `clone-outputs`, `private-pool`, `copy-inputs`, `eager-family=...`) "
                 "with `repro run --device DEV --repair R --sequence sequence.json`.")
    L.append("")

    L += [f"## Standalone reproducer: `{SCRIPT}`", ""]
    if not sa.generated:
        L += [f"No standalone script is generated for this result: {sa.why_not}.", ""]
    else:
        if sa.weights == "embedded":
            L.append(f"Weights: the layer's real tensors, embedded beside the script as `{WEIGHTS}` ("
                     + ("random weights from a seed did not reproduce the recorded divergence here"
                        if sa.seed_failed else "asked for with --weights embed")
                     + "). It needs `safetensors` too.")
        elif not r["diverged"]:
            L.append(f"Weights: regenerated from {sa.weights} inside the script (random values of the "
                     f"{'checkpoint' if model_here else 'tiny preset'}'s shapes and dtypes). Nothing diverged in "
                     "the suite; the script is the control a maintainer "
                     "can run on another stack.")
        else:
            L.append(f"Weights: regenerated from {sa.weights} inside the script (random values of the "
                     f"{'checkpoint' if model_here else 'tiny preset'}'s shapes and dtypes); the divergence does "
                     "not depend on the real values"
                     + ("." if sa.reproduces and sa.same_place is not False else
                        " as far as this machine could check (see below)."))
        L += ["",
              "It rebuilds the GDN layer chain (`submod0` -> `gdn_core` -> `submod1` with the MoE) in plain torch with "
              "the suite's kernel math, replays the steps above through an eager copy and a graph copy "
              "(`torch.cuda.CUDAGraph` on CUDA, `torch.xpu.XPUGraph` or IPEX's `XPUGraph` on XPU, a TorchDispatchMode "
              "record/replay tape on a CPU), compares bit for bit after every step and prints the first divergence. "
              "Exit 1: reproduced; 0: replay == eager at every step.", ""]
        if sa.checks:
            L += ["Checked here (a clean environment: the script's folder, no PYTHONPATH):", "",
                  "| run | device | outcome | time |", "| --- | --- | --- | --- |"]
            for label, c in sa.checks:
                L.append(f"| {label} | {c.device} | {c.line()} | {c.seconds:.1f} s |")
            L.append("")
            if sa.same_place is False:
                L.append("The script's divergence is not at the same step / tensor as the suite's record: see "
                         "the table.")
            if sa.reproduces is False:
                L.append("**The script does not reproduce the recorded outcome on this machine.** "
                         + ("A baseline divergence recorded on a device can only be reproduced on that device: "
                            "run the script there." if not planted else ""))
        for n in sa.notes:
            L.append(f"- {n}")
        L.append("")

    L += ["## Public cases", ""]
    cited = []
    for h in r["hazards"]:
        if h in hz.HAZARDS and hz.HAZARDS[h].cases:
            cited += _cases(hz.HAZARDS[h].cases)
    if not r["hazards"] and r["diverged"]:
        cited += _cases(BASELINE_CASES.get(str(doc.get("graph_provider")), "PyTorch 122192, vLLM 51928"))
    if cited:
        for proj, num, url in cited:
            if url:
                note = CASE_NOTES.get((proj, num), "")
                L.append(f"- [{proj} {num}]({url})" + (f": {note}" if note else ""))
            else:
                L.append(f"- {proj}")
    else:
        L.append("- none: nothing diverged" if not r["diverged"] else "- none recorded for this hazard")
    L.append("")

    if len(doc["results"]) > 1:
        L += ["## Other results in the file", "",
              "| # | island | mode | hazard | repair | diverged | first divergence |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
        for i, x in enumerate(doc["results"]):
            f = x.get("first_divergence")
            where = f"step {f['step']} {f['island']}.{f['tensor']}" if f else "-"
            L.append(f"| {i}{' (this report)' if i == idx else ''} | {x['island']} | {x['mode']} | "
                     f"{','.join(x['hazards']) or '-'} | {','.join(x['repairs']) or '-'} | {x['diverged']} | {where} |")
        L.append("")
    if notes:
        L += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    L += ["---", f"Written by `repro report` ({time.strftime('%Y-%m-%d %H:%M:%S')})."]
    return "\n".join(L) + "\n"


# ----------------------------------------------------------------------------- entry points

def _title(doc, r) -> str:
    what = ", ".join(r["hazards"]) or "baseline"
    prov = str(doc.get("graph_provider", "?"))
    if doc.get("device") not in (None, "cpu"):
        prov += f" on {doc['device']}"
    if r["diverged"]:
        fd = r["first_divergence"]
        return (f"Graph replay diverges from eager ({what}): {r['island']} {fd['island']}.{fd['tensor']} at step "
                f"{fd['step']}, {r['mode']} mode, {prov}")
    rep = f" + {', '.join(r['repairs'])}" if r["repairs"] else ""
    return f"Graph replay equals eager ({what}{rep}): {r['island']}, {r['mode']} mode, {prov}"


def _replay_command(doc, r, layer, sentinel) -> str:
    cmd = ["repro", "run"]
    if doc.get("checkpoint"):
        cmd += ["--model", str(doc["checkpoint"])]
    prov = str(doc.get("graph_provider", ""))
    cmd += ["--device", "cuda" if prov == "cuda" else "xpu" if "xpu" in prov else "cpu"]
    cmd += ["--island", "all" if r["island"] == "chain" else r["island"], "--mode", r["mode"]]
    for h in r["hazards"]:
        cmd += ["--hazard", h]
    for x in r["repairs"]:
        cmd += ["--repair", x]
    if layer is not None:
        cmd += ["--layer", str(layer)]
    if sentinel == -1 and "pad-sentinel-mismatch" not in r["hazards"]:
        cmd += ["--sentinel", "-1"]
    cmd += ["--sequence", "sequence.json"]
    return " ".join(shlex.quote(c) for c in cmd)


def _model(doc, layer):
    ck = doc.get("checkpoint")
    if not ck or not Path(ck).is_dir():
        return None
    from .islands import Model
    try:
        return Model(ck, "cpu", layer)
    except BadInput:
        return None


def write_report(doc: dict, out_dir, *, command: str | None = None, result_path: str | None = None,
                 index: int | None = None, layer: int | None = None, sentinel: int | None = None,
                 verify: bool = True, seed: int = 0, weights: str = "auto") -> Path:
    """Write the report directory atomically; returns its path."""
    check_result(doc)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise BadInput(f"-o {out}: exists and is not a directory")
    idx = pick(doc, index)
    r = doc["results"][idx]
    kernel_sentinel = _kernel_sentinel(r, sentinel)
    steps, seqj, source = steps_that_ran(doc, r, sentinel)
    notes: list[str] = []
    model = _model(doc, layer)
    if model is None:
        notes.append(f"checkpoint {doc.get('checkpoint')!r} is not readable here: the standalone script uses the "
                     "tiny preset's shapes and the repairs were not run")
    title = _title(doc, r)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        rows = repair_rows(doc, r, steps, seqj, model, sentinel)
        (tmp / "result.json").write_text(json.dumps(doc, indent=2) + "\n")
        (tmp / "sequence.json").write_text(json.dumps(seqj, indent=2) + "\n")
        (tmp / "env.txt").write_text(environment_text(doc))
        sa = make_standalone(tmp, doc, r, steps, seqj, model, sentinel, title, verify, seed, weights)
        replay_cmd = _replay_command(doc, r, layer, kernel_sentinel)
        md = render_markdown(doc, r, idx, steps, seqj, source, rows, sa, notes, command, result_path, replay_cmd,
                             title, kernel_sentinel, layer, model is not None)
        (tmp / "REPORT.md").write_text(md)
        os.chmod(tmp, 0o755)
        if out.exists():
            old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def report_cli(a) -> int:
    doc = load_result(a.result)
    out = write_report(doc, a.output, result_path=a.result, index=a.case, layer=a.layer, sentinel=a.sentinel,
                       verify=not a.no_verify, seed=a.seed, weights=a.weights)
    print(f"wrote {out}/REPORT.md, env.txt, sequence.json" + (f", {SCRIPT}" if (out / SCRIPT).exists() else "")
          + (f", {WEIGHTS}" if (out / WEIGHTS).exists() else ""))
    return 0


def report_hook(doc: dict, a) -> None:
    """`--report DIR` on run / hunt: write the report for the result just produced (`a`: the
    command's arguments, for the command line, layer and sentinel the result does not record)."""
    argv = getattr(a, "argv", None)
    command = "repro " + " ".join(shlex.quote(x) for x in argv) if argv is not None else None
    out = write_report(doc, a.report, command=command, layer=a.layer, sentinel=a.sentinel)
    print(f"report: {out}/REPORT.md")
