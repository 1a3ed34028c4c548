"""REPORT.md, one function per section, over one `Facts` bundle of what the report knows."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..knobs import hazards as hz
from ..knobs.stacks import STACKS, differs
from ..knobs.stacks import stack as stack_profile
from ..search.blame import explain as explain_rules
from .cases import cited, explain, fixes
from .repairs import RepairRow
from .script import SCRIPT, WEIGHTS, Standalone, default_repairs
from ..env import environment as probe


def plural(n: int, word: str) -> str:
    """'1 step', '3 steps': a count and its noun, agreeing."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@dataclass
class Facts:
    doc: dict
    r: dict
    idx: int
    steps: list
    seqj: dict
    source: str  # "run" or "hunt"
    rows: list[RepairRow]
    sa: Standalone
    title: str
    sentinel: int  # the kernels' pad sentinel in this result
    replay_cmd: str
    replay_notes: list = field(default_factory=list)  # what to substitute in the replay command
    command: str | None = None
    result_path: str | None = None
    layer: int | None = None
    model_here: bool = True
    checkpoint: str = "?"  # as shown: no local path
    hunt_steps: int | None = None  # the hunt's minimal sequence length
    notes: list = field(default_factory=list)
    kernel: object = None  # kernel.KernelScript: a kernel finding's own script
    stack: str = "fixed"  # the stack profile the control rules came from (`knobs.stacks`)

    @property
    def fd(self):
        return self.r["first_divergence"] if self.r["diverged"] else None

    @property
    def planted(self) -> bool:
        return bool(self.r["hazards"])

    @property
    def blame(self) -> dict | None:
        """The rule a blind hunt blamed for this result, when it speaks for it (`cases.blame_of`)."""
        return self.r.get("blame")


def _code(text: str, lang: str = "") -> str:
    return f"```{lang}\n{text}\n```"


def _fmt_us(x) -> str:
    return "-" if x is None else f"{x:,.0f}"


def header(f: Facts) -> list[str]:
    r, doc, fd = f.r, f.doc, f.fd
    L = [f"# {f.title}", ""]
    if f.planted:
        mech = "; ".join(f"`{h}`: {hz.HAZARDS[h].mechanism}" for h in r["hazards"])
        L += [f"> Planted hazard. The suite planted {mech}. The divergence below is that mechanism caught in the "
              "act; the report shows how a serving stack runs into it and what clears it.", ""]
    elif r["diverged"] and f.blame:
        L += [f"> **No hazard planted: the `{f.stack}` stack's own control rules make replay differ from eager.** "
              f"A blind hunt found it and named rule {_rules(f.blame)} ({_upstream(f.blame)}); its upstream fix "
              f"clears it ({_fixes(f) or 'none the suite knows'}). This is the defect to report upstream.", ""]
    elif r["diverged"]:
        L += ["> **No hazard planted: replay differs from eager at baseline.** This is the defect to report "
              "upstream.", ""]
    L += ["| | |", "| --- | --- |",
          f"| island | `{r['island']}` |", f"| capture mode | `{r['mode']}` |",
          f"| hazard | {', '.join(f'`{h}`' for h in r['hazards']) or 'none (baseline)'} |",
          f"| repairs applied | {', '.join(f'`{x}`' for x in r['repairs']) or 'none'} |",
          f"| stack profile | `{f.stack}`: {STACKS[f.stack].what} |",
          f"| draft tokens a decode (K) | {r.get('spec_tokens') or f.seqj.get('spec_tokens') or 0} |",
          f"| block size (prefix caching) | {r.get('block_size') or f.seqj.get('block_size') or 'none'} |",
          f"| graph provider | `{doc.get('graph_provider', '?')}` on {doc.get('device', '?')} |",
          f"| torch | {doc.get('torch', '?')} |",
          f"| checkpoint | {f.checkpoint} (layer: {f.layer if f.layer is not None else 'the first GDN layer'}) |",
          f"| kernel pad sentinel | {f.sentinel} |",
          f"| outcome | {('diverged at step ' + str(fd['step'])) if fd else 'clean'} (expected "
          f"{'for this planted hazard' if f.planted else 'of a healthy stack'}: {r.get('expect', 'clean')}) |",
          f"| result | `{f.result_path or 'in memory'}`, results[{f.idx}] of {len(doc['results'])} |"]
    b = doc.get("blame") if doc.get("stack") == f.stack else None
    if b is not None:  # a blind hunt's: the rule whose fixed form clears it (`search/blame.py`)
        said = (f"{_rules(b)}: {_upstream(b)}" + (f"; the fix: {_fixes(f)}" if _fixes(f) else "") if b.get("rules")
                else "none of the profile explains it: a candidate upstream report")
        L.append(f"| rule at fault | {said} "
                 f"({b.get('tried', '?')} reruns of the minimal sequence, each rule where "
                 f"`{f.stack}` departs from the fixed form set to its fixed form) |")
    return L + [""]


def _rules(b: dict) -> str:
    return " + ".join(f"`{x}`" for x in b.get("rules") or [])


def _upstream(b: dict) -> str:
    return b.get("upstream") or "no hazard of the public record sets it"


def _fixes(f: Facts) -> str:
    """The fixes of the rule a blind hunt blamed, each with the upstream change it mirrors."""
    return ", ".join(f"`{x}` ({hz.REPAIRS[x].cases})" if hz.REPAIRS[x].cases else f"`{x}`" for x in fixes(f.r))


def environment(f: Facts) -> list[str]:
    env = probe()
    t, dev, pk = env["torch"], env["devices"], env["packages"]
    gp = [f"{k} ({v['detail']})" for k, v in env["graph_providers"].items() if v["available"]]
    return ["## Environment", "",
            f"- result produced with torch {f.doc.get('torch', '?')}, provider `{f.doc.get('graph_provider', '?')}` "
            f"on {f.doc.get('device', '?')}",
            f"- this report written on: torch {t['version']} ({t['build']}), Python {env['python']}, {env['os']}",
            f"- devices here: CUDA {dev['cuda']['count']} ({', '.join(dev['cuda']['names']) or '-'}), "
            f"XPU {dev['xpu']['count']} ({', '.join(dev['xpu']['names']) or '-'}); graphs: {', '.join(gp)}",
            f"- IPEX {pk.get('intel_extension_for_pytorch')}, oneCCL bindings {pk.get('oneccl_bindings_for_pytorch')}, "
            f"XCCL {'yes' if env['distributed']['xccl'] else 'no'}, Triton {pk.get('triton')}, FLA {pk.get('fla')}",
            "- everything, drivers included: [`env.txt`](env.txt)", ""]


def what_was_run(f: Facts) -> list[str]:
    L = ["## What was run", ""]
    if f.command:
        L += ["The command that produced this result:", "", _code(f.command, "sh"), ""]
    else:
        L += ["The result file does not record its command line; this replays the same case:", ""]
    L += ["Replay exactly this case with the suite (the steps are in `sequence.json`):", "",
          _code(f.replay_cmd, "sh"), ""] + [f"- {n}" for n in f.replay_notes] + ([""] if f.replay_notes else [])
    if f.sa.generated:
        rep = default_repairs(f.r)
        L += [f"Or with {f.sa.needs}:", "",
              _code(f"python {SCRIPT}            # exit 1: reproduced, 0: not"
                    + (f"\npython {SCRIPT} --repair   # with {', '.join(rep)}" if rep else ""), "sh"), ""]
    return L


def expected_actual(f: Facts) -> list[str]:
    r, fd = f.r, f.fd
    L = ["## Expected vs actual", "",
         "- **Expected:** graph replay computes exactly what eager computes: every island output of every live "
         "row, the state rows of every slot the step touches and the canary token ids are equal bit for bit at "
         "every step (they are on the CPU tape and on CUDA at baseline)."]
    ran = plural(r["steps"], "step") if isinstance(r.get("steps"), int) else "? steps"
    if fd:
        L.append(f"- **Actual:** step {fd['step']}: `{fd['island']}.{fd['tensor']}`"
                 + (f" row {fd['row']}" if fd.get("row") is not None else "")
                 + (f" (request {fd.get('request')}, slot {fd.get('slot')})" if fd.get("slot") is not None else "")
                 + f" differs, max |eager - replay| = {float(fd['max_abs']):.4g}, after {ran}.")
    else:
        L.append(f"- **Actual:** replay equals eager bit for bit over {ran}.")
    if r.get("findings"):
        L.append("- Findings of the capture-time lint: " + "; ".join(f"{x['kind']} ({x['island']}): {x['detail']}"
                                                                      for x in r["findings"]))
    return L + [""]


def sequence(f: Facts) -> list[str]:
    nreq, nsteps = plural(len(f.seqj.get("requests", [])), "request"), plural(len(f.steps), "step")
    L = ["## Minimal request sequence", ""]
    if f.source == "hunt":
        total = f.hunt_steps if f.hunt_steps is not None else len(f.steps)
        L.append(f"Shrunk by `repro hunt` to a sequence of {plural(total, 'step')}"
                 + (f"; the first divergence is at step {f.fd['step']}, so the {nsteps} up to and including it "
                    f"({nreq}) are shown here and written to `sequence.json`." if f.fd and total != len(f.steps)
                    else f" ({nreq})."))
    else:
        L.append(f"The steps of the run up to and including the first divergent step ({nsteps}, {nreq}); "
                 "`repro hunt` shrinks further.")
    L += ["", "| request | prompt tokens | decode steps | arrives at step | preempted after |",
          "| --- | --- | --- | --- | --- |"]
    for q in f.seqj.get("requests", []):
        L.append(f"| {q['rid']} | {q['prompt_len']} | {q['decode_steps']} | {q.get('arrive', 0)} | "
                 f"{q.get('preempt_after') if q.get('preempt_after') is not None else '-'} |")
    L += ["", "| step | requests | slots | query lens | has initial state | tokens | kind |",
          "| --- | --- | --- | --- | --- | --- | --- |"]
    for s in f.steps:
        kind = "decode" if all(q == 1 for q in s["query_lens"]) and all(s["has_initial_state"]) else "mixed/prefill"
        L.append(f"| {s['step']} | {s['request_ids']} | {s['slots']} | {s['query_lens']} | "
                 f"{[int(b) for b in s['has_initial_state']]} | {len(s['token_ids'])} | {kind} |")
    return L + [""]


def first_divergence(f: Facts) -> list[str]:
    fd = f.fd
    L = ["## First divergence", ""]
    if not fd:
        return L + ["None: no step diverged.", ""]
    ctx = (f.r.get("microscope") or fd).get("context", {})
    this, prev = ctx.get("this_step", {}), ctx.get("previous_step", {})
    L += [f"- where: step {fd['step']}, island `{fd['island']}`, tensor `{fd['tensor']}`"
          + (f", row {fd['row']}" if fd.get("row") is not None else "")
          + f", request {fd.get('request')}, slot {fd.get('slot')}, max abs diff {float(fd['max_abs']):.4g}"]
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
        L += [f"| `{k}` | `{ed[k]}` | `{rd.get(k)}` | {'differs' if ed[k] != rd.get(k) else ''} |" for k in ed]
        if fd["tensor"] in ("conv_state", "ssm_state"):
            L.append(f"\nEvery output agrees; the state row of slot {fd.get('slot')} does not, so the error "
                     "surfaces at a later step, in the output of whichever request reads that slot next.")
    return L + [""] + explain(f.r, fd, f.sentinel) + [""]


def repairs(f: Facts) -> list[str]:
    L = ["## Repairs", ""]
    if f.blame and not f.planted:
        L += [f"The hunt blamed rule {_rules(f.blame)} ({_upstream(f.blame)}). Its upstream fixes, each the rule's "
              f"fixed form on the `{f.stack}` stack: {_fixes(f) or 'none the suite knows'}."
              + (f" `python {SCRIPT} --repair` applies `{default_repairs(f.r)[0]}`; with the suite: `repro run "
                 f"--island {f.r['island']} --mode {f.r['mode']} --repair {default_repairs(f.r)[0]} --sequence "
                 "sequence.json`." if default_repairs(f.r) else ""), ""]
    if f.rows:
        L += ["| repair | clears it | replay µs/step with it | healthy run (no hazard) | cost (with / healthy) "
              "| measured |", "| --- | --- | --- | --- | --- | --- |"]
        for row in f.rows:
            clears = "-" if row.diverged is None else ("no" if row.diverged else "yes")
            cost = f"{row.cost:.2f}x" if row.cost else "-"
            note = "; ".join(x for x in (row.note, row.why_no_cost) if x)
            L.append(f"| `{row.repair}` | {clears} | {_fmt_us(row.replay_us)} | {_fmt_us(row.baseline_us)} | {cost} | "
                     f"{row.source}{': ' + note if note else ''} |")
        L += ["", "A cost compares runs of the same steps: the repaired case against a healthy one (no hazard, no "
              "repair), never against the diverging run, which stopped at its first divergence."]
        if any(row.cost for row in f.rows) and (f.doc.get("graph_provider") == "cpu-tape"
                                                or any(row.source.startswith("run here") for row in f.rows)):
            L += ["", "Costs on the CPU tape measure the emulation, not a device: read them as relative, and rerun "
                  f"`repro run --device DEV{' --hazard H' if f.planted else ''} --repair R --sequence sequence.json` "
                  "on the device for real numbers."]
    elif f.planted:
        L.append("No repair is known for this hazard.")
    elif not f.r["diverged"]:
        L.append("Nothing diverged: no repair is needed.")
    else:
        runner = ", ".join(f"`{x.name}`" for x in hz.REPAIRS.values()
                           if any(k.startswith("runner.") for k in x.sets) and not x.device_only)
        stack = f.r.get("stack") or "fixed"
        if stack != "fixed":
            departs = differs(stack_profile(stack).rules)
            named = [x for h in explain_rules(departs)[0] for x in hz.HAZARDS[h].repairs]
            L.append(f"The case ran under the `{stack}` stack's control rules, which depart from the fixed form in "
                     f"{', '.join(f'`{x}`' for x in departs)}. `repro hunt --stack {stack}` names the rule whose fixed "
                     "form clears it alone; the fixes of those rules: "
                     + (", ".join(f"`{x}`" for x in dict.fromkeys(named)) or "none the suite knows")
                     + " (`repro run --repair R --sequence sequence.json`: the file keeps the stack).")
        else:
            L.append(f"Nothing was planted, so there is no hazard-specific repair. On the device, try the runner-side "
                     f"repairs ({runner}) with `repro run --device DEV --repair R --sequence sequence.json`.")
    return L + [""]


def standalone(f: Facts) -> list[str]:
    sa, r = f.sa, f.r
    L = [f"## Standalone reproducer: `{SCRIPT}`", ""]
    if not sa.generated:
        return L + [f"No standalone script is generated for this result: {sa.why_not}.", ""]
    shapes = "checkpoint" if f.model_here else "tiny preset"
    if sa.weights == "embedded":
        L.append(f"Weights: the layer's real tensors, embedded beside the script as `{WEIGHTS}` ("
                 + ("random weights from a seed did not reproduce the recorded divergence here"
                    if sa.seed_failed else "asked for with --weights embed")
                 + f"). It needs {sa.needs}.")
    elif not r["diverged"]:
        L.append(f"Weights: regenerated from {sa.weights} inside the script (random values of the {shapes}'s "
                 "shapes and dtypes). Nothing diverged in the suite; the script is the control a maintainer can "
                 "run on another stack.")
    else:
        L.append(f"Weights: regenerated from {sa.weights} inside the script (random values of the {shapes}'s "
                 "shapes and dtypes); the divergence does not depend on the real values"
                 + ("." if sa.reproduces and sa.same_place is not False else
                    " as far as this machine could check (see below)."))
    L += ["", "It rebuilds the GDN layer chain (`submod0` -> `gdn_core` -> `submod1` with the MoE) in plain torch "
          "with the suite's own reference kernels (copied into the script when it was written), replays the steps "
          "above through an eager copy and a graph copy (`torch.cuda.CUDAGraph` on CUDA, `torch.xpu.XPUGraph` or "
          "IPEX's `XPUGraph` on XPU, a TorchDispatchMode record/replay tape on a CPU), compares bit for bit after "
          "every step and prints the first divergence. Exit 1: reproduced; 0: replay == eager at every step.", ""]
    if sa.checks:
        L += ["Checked here (a clean environment: the script's folder, no PYTHONPATH):", "",
              "| run | device | outcome | time |", "| --- | --- | --- | --- |"]
        L += [f"| {label} | {c.device} | {c.line()} | {c.seconds:.1f} s |" for label, c in sa.checks]
        L.append("")
        if sa.same_place is False:
            L.append("The script's divergence is not at the same step / tensor as the suite's record: see the table.")
        if sa.reproduces is False:
            L.append("**The script does not reproduce the recorded outcome on this machine.** "
                     + ("A baseline divergence recorded on a device can only be reproduced on that device: "
                        "run the script there." if not f.planted else ""))
    return L + [f"- {n}" for n in sa.notes] + [""]


def others(f: Facts) -> list[str]:
    if len(f.doc["results"]) < 2:
        return []
    L = ["## Other results in the file", "",
         "| # | island | mode | hazard | repair | diverged | first divergence |",
         "| --- | --- | --- | --- | --- | --- | --- |"]
    for i, x in enumerate(f.doc["results"]):
        d = x.get("first_divergence")
        where = f"step {d['step']} {d['island']}.{d['tensor']}" if d else "-"
        L.append(f"| {i}{' (this report)' if i == f.idx else ''} | {x['island']} | {x['mode']} | "
                 f"{','.join(x['hazards']) or '-'} | {','.join(x['repairs']) or '-'} | {x['diverged']} | {where} |")
    return L + [""]


def kernel_finding(f: Facts) -> list[str]:
    k = f.kernel
    if k is None or k.finding is None:
        return []
    fd, call = k.finding, k.finding["kernel"]
    L = ["## Kernel finding", "",
         f"At step {fd['step']} the kernel itself showed **{fd['kind']}**: {fd['reason']}.",
         f"The first call into a kernel's own package that shows it is `{call['function']}` (call {call['call']} "
         f"of the step), max |d| {call['max_abs']:.3g}.", ""]
    if k.files:
        L += [f"`{k.files[1]}` imports only torch and that package. It loads the call's recorded inputs "
              f"(`{k.files[0]}`), calls the function again, and exits 1 when the effect shows:", "",
              _code(f"python {k.files[1]}   # optional argument: a device to load the inputs on"), ""]
    else:
        L += [f"No script was written: {k.note}.", ""]
    return L


SECTIONS = (header, environment, what_was_run, expected_actual, sequence, first_divergence, repairs, standalone,
            kernel_finding)


def render_markdown(f: Facts) -> str:
    L: list[str] = []
    for section in SECTIONS:
        L += section(f)
    L += ["## Public cases", ""] + cited(f.doc, f.r) + [""]
    L += others(f)
    if f.notes:
        L += ["## Notes", ""] + [f"- {n}" for n in f.notes] + [""]
    L += ["---", f"Written by `repro report` ({time.strftime('%Y-%m-%d %H:%M:%S')})."]
    return "\n".join(L) + "\n"
