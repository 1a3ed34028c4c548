"""`docs/real-bugs.md`: one row per bug of the public record, made from the hazard table, the stack
profiles and a `repro bench --hunt-rates` result (what the told and blind hunts found, and how fast),
never kept by hand."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

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
    ("vLLM #35431, #39064", "the XPU SYCL `gdn_attention` kernel's own index guard (vllm-xpu-kernels, compiled): "
     "the stored sources read and write `ssm_state[index]` with no <= 0 check, so on XPU a null or stale index "
     "writes block 0 rather than being skipped; the rebuild's kernels skip the sentinel they are given."),
)

# What this suite's own searches found in a fix of the record (candidate upstream reports).
FOUND_HERE = (
    ("vLLM PR #53059 (open; the fix proposed for vLLM #53051)",
     "its check (`num_computed_tokens >= num_prompt_tokens` for every request) lets a preempted request's recompute "
     "through: the recompute covers the prompt and the tokens kept before the preemption, and when its last chunk is "
     "exactly 1+k tokens past the prompt the batch is a uniform decode, replays the FULL graph, and the GDN builder, "
     "in its prefill branch, stages nothing (vLLM #53051's mechanism). PR #47123's rule, as this rebuild reads it, "
     "has the same hole. The V2 runner's form (vLLM PR #51865, `prefill_len`) does not: the fixed stack uses it. "
     "Found by `repro hunt --stack fixed --profile soak --spec-tokens 2 --mode full_and_piecewise` on the CPU while "
     "the fixed stack used PR #53059's form: 4 requests, 7 steps (request 7, prompt 8, preempted after 3 decodes, "
     "recomputed in chunks of 7, 7 and 3), first divergence step 6 `gdn_core.core_out`; stated by "
     "`tests/test_resumed_recompute.py`. Shown through vLLM 0.33.0's own scheduler and V1 runner decisions with "
     "PR #53059's hunk applied (`--control vllm --patch patches/vllm_pr53059.py`): one request of prompt 2, "
     "preempted after one decode that kept 3 tokens, resumed by vLLM in chunks of the budget of 3; the last chunk "
     "replays the FULL graph, which reads the rows the request's last decode staged before its preemption; the "
     "same with PR #47123's hunk, and clean under the V2 runner's decisions (`tests/test_vllm_control.py`). "
     "`repro report` of that finding writes the upstream report, with a script that needs only torch and vLLM "
     "0.33.0 (exit 1; 0 with the V2 rule)."),
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


def _as_rates_json(command: str) -> str:
    """The bench's command line with its --json file called RATES.json, as the page's commands name it."""
    words = shlex.split(command)
    if "--json" in words[:-1]:
        words[words.index("--json") + 1] = "RATES.json"
    return shlex.join(words)


def markdown(rates: dict | None) -> str:
    """The page (`rates`: a `repro bench --hunt-rates` result, or None for the table alone)."""
    rows = (rates or {}).get("hunt_rates") or {}
    bound = (rates or {}).get("hunt_rates_bound") or {}
    out = ["# The public bug record, reproduced", "",
           "Generated by `python tools/real_bugs.py RATES.json > docs/real-bugs.md` from the hazard table "
           "(`repro/knobs/hazards.py`), the stack profiles (`repro/knobs/stacks.py`) and a "
           "`repro bench --hunt-rates --json RATES.json` result"
           + (f" ({rates.get('device', '?')}, {rates.get('graph_provider', '?')}, torch {rates.get('torch', '?')})"
              if rates else "") + "."]
    if rates and rates.get("command"):
        out += ["", "Regenerate it with:", "", "```sh", f"python -m {_as_rates_json(rates['command'])}",
                "python tools/real_bugs.py RATES.json > docs/real-bugs.md", "```", "",
                "Seconds are wall-clock on the machine that ran the bench (a CPU shared with other work reads "
                "slower); no test asserts them."]
    out += ["", "| upstream | hazard | mechanism | stacks exposed | minimal trigger (told hunt) | first divergence | "
            "repairs (upstream fixes) | standalone report |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for h in (h for h in HAZARDS.values() if h.record):
        told = (rows.get(h.name) or {}).get("told")
        fixes = "; ".join(f"`{x}` ({REPAIRS[x].cases or REPAIRS[x].what})" for x in h.repairs)
        scripts = ([f"`python3 {STANDALONE[h.name]}`"] if h.name in STANDALONE else []) + \
            (["`repro report RESULT.json -o DIR`"] if h.standalone else [])
        script = "; ".join(scripts) or "-"
        out.append(f"| {h.cases} | `{h.name}` | {h.mechanism} | {', '.join(exposed(h)) or '-'} | {_trigger(told)} | "
                   f"{_where(told)} | {fixes} | {script} |")
    out += ["", "## Which rules each stack has", "",
            "| rule | " + " | ".join(STACKS) + " |", "| --- |" + " --- |" * len(STACKS)]
    for rule in next(iter(STACKS.values())).sources:
        cells = [str(getattr(s.rules, rule).value if hasattr(getattr(s.rules, rule), "value")
                     else getattr(s.rules, rule)) for s in STACKS.values()]
        out.append(f"| `{rule}` | " + " | ".join(cells) + " |")
    out += ["", "Each setting's source (file and function in the release's wheel) is in "
            "`repro/knobs/stacks.py`.", "", "## The newest release", "", CHANGED_IN_034, "",
            "## What the rebuild cannot express", ""]
    out += [f"- {who}: {what}" for who, what in NOT_EXPRESSED]
    out += ["", "## Found by this suite", ""] + [f"- {who}: {what}" for who, what in FOUND_HERE]
    if rows:
        out += ["", "## Time to a reproducer", "",
                "Seconds from a hunt's start (the checkpoint loaded) to the first failing sequence and to the minimal "
                f"one, the shrinking included, each hunt derandomised (`--profile {bound.get('profile', 'ci')}`) and "
                f"bounded by {bound.get('examples', '?')} sequences. Told: `repro hunt --hazard H` on the fixed "
                "stack. Blind: `repro hunt --stack S` with no hazard, S the first profile that departs from the fixed "
                "form in one of the hazard's rules, drawing the sequences the hazard needs (its K, dummy steps); "
                "after shrinking, each rule where S departs is set to its fixed form (then pairs) and the minimal "
                "sequence rerun, and the rules whose fixed forms clear the failure are named.", ""]
        out += _time_rows(rows)
        blind = [(n, r["blind"]) for n, r in rows.items() if r.get("blind") and r["blind"].get("found")]
        if blind:
            out += ["", "Minimal sequences of the blind hunts:", ""]
            out += [f"- `{n}` on {b['stack']}: {_trigger(b)}; first divergence {_where(b)}" for n, b in blind]
    return "\n".join(out) + "\n"


def render(path: str | Path | None) -> str:
    return markdown(json.loads(Path(path).read_text()) if path else None)
