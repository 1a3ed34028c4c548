"""What a report cites and how it explains the mechanism: public issues, and what the planted
hazard did in this very case, read from the typed options the hazard table sets (never from a
hazard's name)."""
from __future__ import annotations

import re

from ..knobs import hazards as hz
from ..knobs.options import Pad
from ..knobs.stacks import differs
from ..knobs.stacks import stack as stack_profile
from ..search.blame import explain as explain_rules

ISSUE_URLS = {
    "vLLM": "https://github.com/vllm-project/vllm/issues/{}",
    "vLLM PR": "https://github.com/vllm-project/vllm/pull/{}",
    "PyTorch": "https://github.com/pytorch/pytorch/issues/{}",
    "torch-xpu-ops": "https://github.com/intel/torch-xpu-ops/issues/{}",
    "auto-round": "https://github.com/intel/auto-round/issues/{}",
}
# What each public case shows, so a reader knows why it is cited.
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
    ("vLLM", "53051"): "with drafts, a prompt of 1+k tokens is called a uniform decode and replayed through the FULL "
                       "graph, whose GDN buffers were not staged for it",
    ("vLLM", "49918"): "the same dispatch of a prefill into the FULL decode graph",
    ("vLLM PR", "53059"): "the fix: a batch is a uniform decode only when every request is past its prompt",
    ("vLLM PR", "47123"): "a hybrid model's batch with a request in its prompt is never a uniform decode",
    ("vLLM PR", "55123"): "the replay path asserts a FULL dispatch has no request in its prompt (a loud error)",
}
# Cited for a divergence with no planted hazard (the upstream bug itself), by provider.
BASELINE_CASES = {
    "xpu": "vLLM #48327, #48946, #51928, PyTorch #196490, torch-xpu-ops #2992",
    "ipex-xpu": "vLLM #48327, #48946, #51928, PyTorch #196490, torch-xpu-ops #2992",
    "cuda": "PyTorch #122192, vLLM #37728",
}


def parse_cases(text: str) -> list[tuple[str, str, str | None]]:
    """'vLLM #35431, #39064, PyTorch #1' -> [(project, number, url)], as the hazard table cites them
    (the `#` may be left out); 'vLLM PR #53059' -> ("vLLM PR", "53059", its pull request's url);
    free text ('lab notes ...') stays as is."""
    out, project = [], None
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        m = re.fullmatch(r"(vLLM PR|vLLM|PyTorch|torch-xpu-ops|auto-round)?\s*#?(\d+)", part)
        if m and (m.group(1) or project):
            project = m.group(1) or project
            out.append((project, m.group(2), ISSUE_URLS[project].format(m.group(2))))
        else:
            out.append((part, "", None))
            project = None
    return out


def blame_of(doc: dict, idx: int, stack: str) -> dict | None:
    """A blind hunt's blame (`search.blind`), when it speaks for result `idx` reported on `stack`:
    the hunt's one result, on the stack it searched, with a rule named. None otherwise."""
    b = doc.get("blame")
    if not b or not b.get("rules") or "minimal_sequence" not in doc or idx != 0 or stack != doc.get("stack"):
        return None
    return b


def fixes(r: dict) -> list[str]:
    """The repairs that fix the rules a blind hunt blamed for result `r` (its `blame`): each repair of
    a blamed record hazard that sets one of those rules, in the table's order (a repair that sets only
    the guard beside the rule, vLLM PR #55123's assertion, turns the failure into a loud error
    instead of fixing it, and is left out)."""
    b = r.get("blame")
    if not b:
        return []
    out = []
    for h in b["hazards"]:
        for name in hz.HAZARDS[h].repairs:
            rules = {k.partition(".")[2] for k in hz.REPAIRS[name].sets if k.startswith("control.")}
            if rules & set(b["rules"]) and name not in out:
                out.append(name)
    return out


def cited(doc: dict, r: dict) -> list[str]:
    """Markdown lines: the public cases of the planted hazards, of the rule a blind hunt blamed and
    its fixes, or of a baseline divergence."""
    found = []
    for h in r["hazards"]:
        found += parse_cases(hz.HAZARDS[h].cases)
    if not r["hazards"] and r.get("blame"):
        for h in r["blame"]["hazards"]:
            found += parse_cases(hz.HAZARDS[h].cases)
        for x in fixes(r):
            found += parse_cases(hz.REPAIRS[x].cases)
    elif not r["hazards"] and r["diverged"]:
        found += parse_cases(BASELINE_CASES.get(str(doc.get("graph_provider")), "PyTorch #122192, vLLM #51928"))
    lines = []
    for proj, num, url in found:
        note = CASE_NOTES.get((proj, num), "")
        lines.append(f"- [{proj} #{num}]({url})" + (f": {note}" if note else "") if url else f"- {proj}")
    return lines or ["- none: nothing diverged" if not r["diverged"] else "- none recorded for this hazard"]


def explain(r: dict, fd: dict | None, sentinel: int) -> list[str]:
    """What the mechanism did in this very case, in the microscope's terms."""
    if fd is None:
        return []
    ctx = (r.get("microscope") or {}).get("context", {})
    this, prev = ctx.get("this_step", {}), ctx.get("previous_step", {})
    pads = this.get("pad_state_indices")
    opts = hz.options_for(r["hazards"])  # what the hazards set, before any repair
    out = []
    if opts.runner.pad is Pad.STALE and pads is not None:
        out.append(f"Step {this.get('step')} had {len(this.get('slots', []))} live decode rows padded to "
                   f"{this.get('padded_to')}. The padded rows' state indices were {pads} and their token ids "
                   f"{this.get('pad_input_ids')}: values left in the persistent buffers by step {prev.get('step')} "
                   f"(slots {prev.get('slots')}, query lens {prev.get('query_lens')}), not the sentinel {sentinel}. "
                   "The captured GDN decode treated them as live rows and wrote their state into slot "
                   f"{fd.get('slot')} "
                   f"(the last writer of a slot wins), clobbering request {fd.get('request')}'s {fd.get('tensor')}.")
    if opts.runner.pad is Pad.OTHER and pads is not None:
        out.append(f"The runner padded the state indices with {pads[:1] or ['?']} while the kernel skips only "
                   f"{sentinel}: the padded rows of step {this.get('step')} (padded to {this.get('padded_to')}) "
                   f"were live rows for slot {fd.get('slot')}, a real slot here, and overwrote its "
                   f"{fd.get('tensor')}.")
    if opts.replay_island.trim_moe_to_context:
        details = [f["detail"] for f in r.get("findings", []) if f.get("kind") == "python-state"]
        details.sort(key=lambda d: f"size {this.get('padded_to')} " not in d)  # this step's size first
        out.append(f"The MoE trims its rows to the forward context's `num_actual_tokens`, a Python int read while "
                   f"the graph was captured. At step {fd.get('step')} the step had {sum(this.get('query_lens', []))} "
                   f"tokens but the replay used the frozen count, so row {fd.get('row')} of "
                   f"{fd.get('island')}.{fd.get('tensor')} differs."
                   + (f" Capture-time finding: {details[0]}" if details else ""))
    if opts.replay_island.fresh_core_out:
        out.append("The eager splitting op (`gdn_core`) returned a freshly allocated `core_out` instead of writing "
                   "the buffer graph 1 was captured with; the replayed graph 1 read the captured address, which "
                   f"holds stale bytes, so {fd.get('island')}.{fd.get('tensor')} row {fd.get('row')} differs.")
    if not r["hazards"]:
        out.append(_unplanted(r.get("stack") or "fixed", r.get("blame")))
    return out


def _unplanted(stack: str, blame: dict | None = None) -> str:
    """Where a divergence with no planted hazard comes from: the rule a blind hunt blamed, else the
    stack's control rules where it departs from the fixed form, else the graph stack itself."""
    if blame:
        rules = " + ".join(f"`{x}`" for x in blame["rules"])
        how = " ".join(f"{hz.HAZARDS[h].cases} (`{h}`): {hz.HAZARDS[h].mechanism}." for h in blame["hazards"])
        return (f"No hazard was planted: the case ran under the `{stack}` stack's own control rules. The hunt reran "
                f"the minimal sequence with each rule where `{stack}` departs from the fixed form set to its fixed "
                f"form, and {rules} alone clears it ({blame.get('tried', '?')} reruns). {how}")
    departs = differs(stack_profile(stack).rules)
    if departs:
        cases = explain_rules(departs)[1]
        return (f"No hazard was planted, but the case ran under the `{stack}` stack, whose control rules depart "
                f"from the fixed form in {', '.join(f'`{x}`' for x in departs)} ({cases or 'no record hazard'}). A "
                f"divergence here comes from one of those rules: `repro hunt --stack {stack}` names the rule whose "
                "fixed form clears it, and a generated standalone script runs under the same rules.")
    return ("No hazard was planted: the runner pads with the kernel's sentinel, keeps the splitting op's "
            "outputs in place and recaptures nothing. A divergence here is a defect of the graph stack "
            "(capture, replay, pool or kernels under capture) on this device: the upstream bug.")
