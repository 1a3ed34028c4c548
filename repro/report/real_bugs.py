"""`docs/real-bugs.md`: one row per bug of the public record, made from the hazard table, the stack
profiles and `repro bench --hunt-rates` results (what the told and blind hunts found, and how fast),
never kept by hand. The first result is the default providers'; each further one is the same bench
under other kernels (`--kernels gdn=xpu_semantics`: the B70's fused GDN core, whose rules the page
lists from `kernels/gdn/xpu_rules.py`), and adds a column to the record's table."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

from kernels.gdn import xpu_rules

from ..knobs.hazards import HAZARDS, REPAIRS
from ..knobs.stacks import STACKS

STANDALONE = {h.name: h.script for h in HAZARDS.values() if h.script}  # the torch-only reproducers

# What the threads show that this rebuild cannot express, so no look-alike is planted for it.
NOT_EXPRESSED = (
    ("vLLM #49757", "the V1 half: `condense()` leaves a live request's block ids in the row it moved from, and a "
     "dummy run padded by data-parallel coordination to more rows than its own reads them. The rebuild runs one "
     "rank: its dummy run has one request row (`_dummy_run(1+k)`), which `condense()` never vacates, so only the "
     "re-staging half is a hazard; the move-row rule is still a stack setting."),
    ("vLLM #37728, #49757", "data-parallel lockstep itself (ranks agreeing on a padded batch and a graph mode) and "
     "state blocks written by a KV connector outside any stream."),
    ("vLLM #53051", "the MTP drafter's acceptance collapse after a bad state: draft tokens are inputs here, and "
     "accepted counts part of the sequence."),
    ("vLLM #37363", "the compiler side: a multi-output splitting op's `getitem` nodes splitting into a cycle "
     "(`split_graph`); the stale input address itself is a hazard of the table."),
)

# What this suite's own searches found in a fix of the record (candidate upstream reports).
FOUND_HERE = (
    ("vLLM PR #53059 (open; the fix proposed for vLLM #53051)",
     "its check (`num_computed_tokens >= num_prompt_tokens` for every request) lets a preempted request's recompute "
     "through: the recompute covers the prompt and every token sampled before the preemption, and when its last "
     "chunk is exactly 1+k tokens past the prompt the batch is a uniform decode, replays the FULL graph, and the GDN "
     "builder, in its prefill branch, stages nothing (vLLM #53051's mechanism). PR #47123's rule, as this rebuild "
     "reads it, has the same hole. The V2 runner's form (vLLM PR #51865, `prefill_len`) does not: the fixed stack "
     "uses it. Found by `repro hunt --stack fixed --profile soak --spec-tokens 2 --mode full_and_piecewise` on the "
     "CPU while the fixed stack used PR #53059's form. vLLM 0.33.0's own V1 scheduler, run on the CPU, makes the "
     "chunk; its smallest stream: 1 request, prompt 2, k=2, a step budget of 3, preempted after one decode that kept "
     "its 3 tokens, recomputed in chunks of 3 and 3 (with a block size of 3, from its own cached block in one chunk "
     "of 3); first divergence at the last chunk (step 3); stated by `tests/test_resumed_recompute.py` and "
     "`tests/test_vllm_schedule.py`. The runner's side is this rebuild's. Shown through "
     "vLLM 0.33.0's own scheduler and V1 runner decisions with PR #53059's hunk applied (`--control vllm --patch "
     "patches/vllm_pr53059.py`): the last chunk replays the FULL graph, which reads the rows the request's last "
     "decode staged before its preemption; the same with PR #47123's hunk, and clean under the V2 runner's decisions "
     "(`tests/test_vllm_control.py`). `repro report` of that finding writes the upstream report, with a script that "
     "needs only torch and vLLM 0.33.0 (exit 1; 0 with the V2 rule)."),
)

CHANGED_IN_034 = (
    "vLLM 0.34.0 removed the V1 model runner (`v1/worker/gpu_model_runner.py`, `gpu_input_batch.py`, "
    "`block_table.py`, `cudagraph_dispatcher.py`): the V2 runner decides uniform decode by phase "
    "(`gather_batch_req_state`: `decode_graph_eligible`, vLLM #51865), so a prefill is not replayed through a FULL "
    "decode graph; its dummy block tables are zeroed and FULL dummy runs build metadata for capture (vLLM #49757); "
    "the GDN builder's staging rule (only batches without a prefill) and its first-chunk rule (vLLM #51565) are "
    "unchanged, and `supports_update_block_table` now covers XPU.")


def exposed(hazard) -> list[str]:
    """The profiles whose rules are the hazard's (every control rule it sets, set as it sets it)."""
    rules = {k.partition(".")[2]: v for k, v in hazard.sets.items() if k.startswith("control.")}
    if not rules:
        return []
    return [s.name for s in STACKS.values() if all(getattr(s.rules, r) == v for r, v in rules.items())]


def _trigger(hunt: dict | None) -> str:
    """A hunt's minimal sequence in words: its requests' prompts and decodes, K, dummy steps, steps."""
    seq = (hunt or {}).get("minimal_sequence") or {}
    reqs = seq.get("requests", [])
    if not reqs:
        return "-"
    each = ", ".join(f"prompt {r['prompt_len']}" + (f" + {r['decode_steps']} decodes" if r.get("decode_steps") else "")
                     for r in reqs)
    parts = [f"{len(reqs)} request{'s' if len(reqs) != 1 else ''} ({each}), k={seq.get('spec_tokens', 0)}",
             f"{len(seq.get('steps', []))} step{'s' if len(seq.get('steps', [])) != 1 else ''}"]
    if seq.get("data_parallel"):
        parts.append("dummy steps on idle ticks")
    return "; ".join(parts)


def _where(hunt: dict | None) -> str:
    fd = (hunt or {}).get("first_divergence") or {}
    if fd.get("step") is None:
        return (fd.get("line") or "-").replace("|", "\\|")
    return f"step {fd['step']}, `{fd['island']}.{fd['tensor']}`"


def _secs(hunt: dict | None, key: str) -> str:
    if not hunt:
        return "-"
    if not hunt.get("found"):
        return f"not found in {hunt.get('examples')}"
    return f"{hunt.get(key)}"


def _time_rows(rows: dict) -> list[str]:
    out = ["| hazard | told: first failure s | told: minimal s | told: sequences run | blind stack | "
           "blind: first failure s | blind: minimal s | blind: rule named (upstream) |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in rows.items():
        if r.get("skipped"):
            out.append(f"| `{name}` | skipped: {r['skipped']} | | | | | | |")
            continue
        t, b = r.get("told"), r.get("blind")
        if b is None:
            blind = f"{r.get('blind_why', 'n/a')} | - | - | -"
        else:
            named = " + ".join(f"`{x}`" for x in b.get("rule") or []) or "none: a candidate upstream report"
            up = f": {b['upstream']}" if b.get("upstream") else ""
            blind = f"{b['stack']} | {_secs(b, 'first_s')} | {_secs(b, 'minimal_s')} | {named}{up}"
        out.append(f"| `{name}` | {_secs(t, 'first_s')} | {_secs(t, 'minimal_s')} | {(t or {}).get('examples', '-')} | "
                   f"{blind} |")
    return out


def _as_rates_json(command: str, name: str = "RATES.json") -> str:
    """The bench's command line with its --json file called `name`, as the page's commands name it."""
    words = shlex.split(command)
    if "--json" in words[:-1]:
        words[words.index("--json") + 1] = name
    return shlex.join(words)


def label(rates: dict | None) -> str:
    """Whose kernels a result ran: the default providers, or the fused GDN core it selected."""
    core = ((rates or {}).get("kernels") or {}).get("gdn_attention", "reference")
    return "default providers" if core == "reference" else f"`{core}`"


def _hurt(entry: dict | None) -> str:
    """A told hunt's outcome: where its minimal sequence first diverges, the state blocks the two
    copies hold apart there (the null block marked), whether a live request is hurt."""
    if not entry:
        return "-"
    if entry.get("skipped"):
        return "refused (below)" if "fused GDN core" in entry["skipped"] else f"skipped: {entry['skipped']}"
    told = entry.get("told") or {}
    if not told.get("found"):
        return f"not found in {told.get('examples')}"
    dmg = (told.get("first_divergence") or {}).get("damage")
    if not dmg:
        return _where(told)
    blocks = ", ".join(f"{b} (null)" if b == dmg.get("null") else str(b) for b in dmg["blocks"]) or "none"
    return f"{_where(told)}; blocks apart: {blocks}; live request hurt: {'yes' if dmg['live'] else 'no'}"


def _outcome(entry: dict | None):
    """What two results are compared on: where, the blocks, whether live (None: no outcome)."""
    told = (entry or {}).get("told") or {}
    if not told.get("found"):
        return (entry or {}).get("skipped") and "refused"
    fd = told.get("first_divergence") or {}
    dmg = fd.get("damage") or {}
    return fd.get("step"), fd.get("tensor"), tuple(dmg.get("blocks") or ()), dmg.get("live")


# Why a record hazard's outcome under the fused core differs from the default providers' (beside its
# table row's cells; a hazard the core refuses says why in the hazard table, `fused_refused`).
def _fused(results: list[tuple[str, dict]]) -> list[str]:
    """The section on the B70's fused GDN core: its rules as read, what is unknown, and where the
    record's outcomes under it differ from the default providers'."""
    out = ["## The B70's GDN kernel (vllm-xpu-kernels' `gdn_attention`)", "",
           "`REPRO_KERNELS=gdn=xpu_semantics` runs the GDN core as one call with the rules of vllm-xpu-kernels' fused "
           "`_xpu_C.gdn_attention` (`kernels/gdn/xpu_semantics.py`; `gdn=vllm_xpu` calls the kernel itself on an "
           "Intel GPU, not run here). Read from " + xpu_rules.SOURCE + ".", "", "The rules:", ""]
    out += [f"{i}. {rule} (`{where}`)" for i, (rule, where) in enumerate(xpu_rules.RULES, 1)]
    out += ["", "Unknown from the sources, so the call is refused in one line rather than guessed:", ""]
    out += [f"- {u}" for u in xpu_rules.UNKNOWN]
    out += ["", "The lockstep does not compare the null block (sentinel 0: block 0, which no request owns): padded "
            "FULL replays write it under these rules, and each result above lists it where it was written.", ""]
    refused = [h for h in HAZARDS.values() if h.record and h.fused_refused]
    out += [f"- `{h.name}` ({h.cases}), its repairs too, is refused under this core: {h.fused_refused}." for h in refused]
    (base_label, base), others = results[0], results[1:]
    for lab, rows in others:
        for h in (h for h in HAZARDS.values() if h.record and not h.fused_refused):
            a, b = base.get(h.name), rows.get(h.name)
            if _outcome(a) == _outcome(b):
                continue
            ta, tb = (a or {}).get("told") or {}, (b or {}).get("told") or {}
            if ta.get("minimal_sequence") != tb.get("minimal_sequence"):  # not the same sequence: no comparison
                out.append(f"- `{h.name}`: the told hunts ended on different minimal sequences ({base_label}: "
                           f"{_trigger(ta)}; {lab}: {_trigger(tb)}), so their outcomes are not compared here.")
                continue
            out.append(f"- `{h.name}` differs under {lab}: {base_label}: {_hurt(a)}; {lab}: {_hurt(b)}. "
                       f"{h.fused_note}".rstrip())
    return out


def markdown(rates: dict | None, *beside: dict) -> str:
    """The page (`rates`: a `repro bench --hunt-rates` result, or None for the table alone; `beside`:
    the same bench under other kernels, one column each)."""
    rows = (rates or {}).get("hunt_rates") or {}
    results = [(label(r), (r or {}).get("hunt_rates") or {}) for r in (rates, *beside)]
    out = _header(rates, beside)
    cols = " | ".join(f"told hunt's first divergence, state blocks apart, live hurt: {lab}" for lab, _ in results)
    out += ["", f"| upstream | hazard | mechanism | stacks exposed | minimal trigger (told hunt) | {cols} | "
            "repairs (upstream fixes) | standalone report |",
            "| --- | --- | --- | --- | --- |" + " --- |" * len(results) + " --- | --- |"]
    for h in (h for h in HAZARDS.values() if h.record):
        told = (rows.get(h.name) or {}).get("told")
        fixes = "; ".join(f"`{x}` ({REPAIRS[x].cases or REPAIRS[x].what})" for x in h.repairs)
        scripts = ([f"`python3 {STANDALONE[h.name]}`"] if h.name in STANDALONE else []) + \
            (["`repro report RESULT.json -o DIR`"] if h.standalone else [])
        script = "; ".join(scripts) or "-"
        hurt = " | ".join(_hurt(r.get(h.name)) for _, r in results)
        out.append(f"| {h.cases} | `{h.name}` | {h.mechanism} | {', '.join(exposed(h)) or '-'} | {_trigger(told)} | "
                   f"{hurt} | {fixes} | {script} |")
    out += ["", "## Which rules each stack has", "",
            "| rule | " + " | ".join(STACKS) + " |", "| --- |" + " --- |" * len(STACKS)]
    for rule in next(iter(STACKS.values())).sources:
        cells = [str(getattr(s.rules, rule).value if hasattr(getattr(s.rules, rule), "value")
                     else getattr(s.rules, rule)) for s in STACKS.values()]
        out.append(f"| `{rule}` | " + " | ".join(cells) + " |")
    out += ["", "Each setting's source (file and function in the release's wheel) is in "
            "`repro/knobs/stacks.py`.", "", "## The newest release", "", CHANGED_IN_034, ""]
    out += _fused(results)
    out += ["", "## What the rebuild cannot express", ""]
    out += [f"- {who}: {what}" for who, what in NOT_EXPRESSED]
    out += ["", "## Found by this suite", ""] + [f"- {who}: {what}" for who, what in FOUND_HERE]
    out += _times(results, (rates or {}).get("hunt_rates_bound") or {})
    return "\n".join(out) + "\n"


def _header(rates: dict | None, beside: tuple) -> list[str]:
    """The page's title, where it comes from, and the commands that regenerate it."""
    out = ["# The public bug record, reproduced", "",
           "Generated by `python tools/real_bugs.py RATES.json [MORE.json ...] > docs/real-bugs.md` from the hazard "
           "table (`repro/knobs/hazards.py`), the stack profiles (`repro/knobs/stacks.py`) and "
           "`repro bench --hunt-rates --json` results"
           + (f" ({rates.get('device', '?')}, {rates.get('graph_provider', '?')}, torch {rates.get('torch', '?')})"
              if rates else "") + "."]
    if rates and rates.get("command"):
        files = ["RATES.json"] + [f"RATES-{i}.json" for i in range(1, len(beside) + 1)]
        out += ["", "Regenerate it with:", "", "```sh"]
        out += [f"python -m {_as_rates_json(r['command'], f)}" for r, f in zip((rates, *beside), files)]
        out += [f"python tools/real_bugs.py {' '.join(files)} > docs/real-bugs.md", "```", "",
                "Seconds are wall-clock on the machine that ran the bench (a CPU shared with other work reads "
                "slower); no test asserts them."]
    return out


def _times(results: list[tuple[str, dict]], bound: dict) -> list[str]:
    """A "Time to a reproducer" section for each bench that has rates, with its blind hunts' minimal
    sequences."""
    out = []
    for lab, rr in results:
        if not rr:
            continue
        out += ["", "## Time to a reproducer" + ("" if lab == results[0][0] else f": {lab}"), "",
                "Seconds from a hunt's start (the checkpoint loaded) to the first failing sequence and to the minimal "
                f"one, the shrinking included, each hunt derandomised (`--profile {bound.get('profile', 'ci')}`) and "
                f"bounded by {bound.get('examples', '?')} sequences. Told: `repro hunt --hazard H` on the fixed "
                "stack. Blind: `repro hunt --stack S` with no hazard, S the first profile that departs from the fixed "
                "form in one of the hazard's rules, drawing the sequences the hazard needs (its K, dummy steps); "
                "after shrinking, each rule where S departs is set to its fixed form (then pairs) and the minimal "
                "sequence rerun, and the rules whose fixed forms clear the failure are named.", ""]
        out += _time_rows(rr)
        blind = [(n, r["blind"]) for n, r in rr.items() if r.get("blind") and r["blind"].get("found")]
        if blind:
            out += ["", "Minimal sequences of the blind hunts:", ""]
            out += [f"- `{n}` on {b['stack']}: {_trigger(b)}; first divergence {_where(b)}" for n, b in blind]
    return out


def render(path: str | Path | None, *beside: str | Path) -> str:
    return markdown(json.loads(Path(path).read_text()) if path else None,
                    *(json.loads(Path(p).read_text()) for p in beside))
