"""The `repro` argument parser: every command's options, their types and their help. Parsing only:
what a command does with its arguments is in the command's module (`run.py`, `model.py`,
`report.py`, `bench.py`, `env.py`), which builds the library's config from them."""
from __future__ import annotations

import argparse

# --steps above this is refused (a run that long belongs in a --sequence file). The scheduler stops
# at 10,000 ticks and the seeded sequence idles on some, so 10,000 steps never fit; 8,000 did for
# every seed tried, and 5,000 leaves room.
MAX_STEPS = 5_000


class Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr and exit 2, like every other bad input."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def count(lo: int, hi: int | None = None):
    """An integer in lo..hi (hi None: no upper bound)."""
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{v} is out of range {lo}..{hi if hi is not None else ''}")
        return v
    return parse


MAX_SEED = 2**32 - 1  # numpy's and most tools' seed range; torch takes more, the suite never needs it


def seed(s: str) -> int:
    """A --seed: an integer in 0..MAX_SEED (a negative or 23-digit seed is a typo, not a choice)."""
    return count(0, MAX_SEED)(s)


def path(s: str) -> str:
    """A file or folder option: any non-empty string (an empty one would silently mean "none")."""
    if not s:
        raise argparse.ArgumentTypeError("an empty path (give a file or folder name, or leave the option out)")
    return s


def counts(lo: int):
    """A comma-separated list of integers >= `lo` (at least one)."""
    one = count(lo)

    def parse(s: str) -> tuple[int, ...]:
        items = [x.strip() for x in s.split(",")]
        if not s.strip() or not all(items):
            raise argparse.ArgumentTypeError(f"{s!r} is not a comma-separated list of integers")
        return tuple(one(x) for x in items)
    return parse


def mode(text: str) -> str:
    """A `--mode` value in vLLM's spelling, any case, as cases spell it (`full` -> `full_and_piecewise`)."""
    from ..knobs.modes import mode_name
    from ..errors import BadInput
    try:
        return mode_name(text)
    except BadInput as e:
        raise argparse.ArgumentTypeError(str(e)) from None


MODE_HELP = ("vLLM's CUDAGraphMode, any case: none, piecewise, full (resolves to full_and_piecewise for GDN), "
             "full_decode_only, full_and_piecewise (default: piecewise and full_and_piecewise)")


def stack_help() -> str:
    from ..knobs.stacks import STACKS
    return "every control rule as one serving stack has it: " + "; ".join(f"{s.name}: {s.what}" for s in STACKS.values())


def _stack(s, default: str | None = "fixed", more: str = "") -> None:
    from ..knobs.stacks import STACKS
    s.add_argument("--stack", default=default, choices=list(STACKS), help=stack_help() + more)


CONTROL_HELP = ("where the runner's control decisions come from: mirror (the suite's rules, the default), vllm (the "
                "installed vLLM's V1 model runner, its own code), vllm-v2 (its V2 runner's host-side decisions); a "
                "vLLM source needs vLLM installed (`tox -e vllm033`)")
PATCH_HELP = ("a Python file that changes the installed vLLM when it is loaded (a PR's hunk, a fork's change): it "
              "defines apply(vllm) and a docstring naming the change (repro/upstream/patches.py; shipped: patches/); "
              "repeatable, applied in order; needs --control vllm or vllm-v2")


def _control(s) -> None:
    s.add_argument("--control", default="mirror", choices=["mirror", "vllm", "vllm-v2"], help=CONTROL_HELP)
    s.add_argument("--patch", action="append", default=[], metavar="FILE", help=PATCH_HELP)


def _spec(s, what: str) -> None:
    s.add_argument("--spec-tokens", type=count(0, 4), default=None, metavar="K", help=what)


def _block(s, what: str) -> None:
    s.add_argument("--block-size", type=count(1, 1024), default=None, metavar="N", help=what)


BLOCK_HELP = ("prefix caching of GDN state in blocks of N tokens (vLLM's mamba_cache_mode align, 1..1024): state "
              "blocks grow with each request, prefill chunks end on block boundaries, a request whose first blocks "
              "of tokens were cached starts from them (the seeded sequences share prefixes); N must exceed K")


RUN_EXIT = ("exit codes: 0 baseline clean and every planted hazard detected; 1 a divergence, a finding on a clean "
            "case, a MISSED hazard, or (with --hazard) the hazard detected; 2 bad input.")
HUNT_EXIT = ("exit codes: 0 nothing found within --max-examples; 1 a failing sequence found (saved, with its replay "
             "line), or a failure that did not repeat on the same sequence; 2 bad input.")


def knobs_help(exit_codes: str = RUN_EXIT) -> str:
    """The hazard and repair names with one line each, from the one table, then the command's exit
    codes (for `run --help` and `hunt --help`)."""
    from ..knobs import hazards as hz
    lines = ["hazards (--hazard, repeatable):"]
    lines += [f"  {h.name:24} {h.mechanism}" for h in hz.HAZARDS.values()]
    lines.append("repairs (--repair, repeatable):")
    lines += [f"  {r.name:24} {r.what}" for r in hz.REPAIRS.values()]
    lines.append(exit_codes)
    return "\n".join(lines)


def _common(s) -> None:
    """The options `run` and `hunt` share (`run` adds --seed: a hunt draws its own sequences)."""
    s.add_argument("--model", type=path, help="checkpoint directory (default: the embedded tiny checkpoint)")
    s.add_argument("--device", default="auto", help="auto | cpu | cuda | xpu")
    s.add_argument("--layer", type=count(0), default=None, help="layer index (default: the first of the right type)")
    s.add_argument("--mode", type=mode, default=None, help=MODE_HELP)
    _stack(s, None, " (default: a --sequence file's own, else fixed)")
    _control(s)
    s.add_argument("--hazard", action="append", default=[], help="plant a hazard (repeatable; listed below)")
    s.add_argument("--repair", action="append", default=[], help="apply a repair (repeatable; listed below)")
    s.add_argument("--sentinel", type=count(-1, 0), default=0, metavar="0|-1",
                   help="the pad sentinel the kernels skip: 0 (slot 0 is a null block, vLLM's default) or -1")
    s.add_argument("--json", type=path, help="write the result (strict JSON) here")
    s.add_argument("--report", type=path, metavar="DIR",
                   help="also write a bug report here (REPORT.md, env.txt, repro_standalone.py)")
    s.add_argument("--force", action="store_true",
                   help="--report into a non-empty DIR: replace what repro wrote there before, keep the rest")
    _plugin(s, "$REPRO_KERNELS")


def _plugin(s, selector: str) -> None:
    """--plugin; `selector`: how this command picks providers ($REPRO_KERNELS, and bench's --kernels)."""
    s.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help=f"import MODULE first: it registers kernel providers that {selector} can then select "
                   "(repeatable; also $REPRO_PLUGINS=mod1,mod2)")


def _run(sub, raw) -> None:
    s = sub.add_parser("run", help="replay against eager in lockstep: each island at baseline, then each hazard "
                       "planted, with and without its repair", formatter_class=raw, epilog=knobs_help())
    _common(s)
    s.add_argument("--island", default="all",
                   help="all | chain (the decode chain alone) | submod0 | gdn_core | submod1 | moe | forced_comm")
    s.add_argument("--baseline", action="store_true",
                   help="only the baseline rows, no hazard planted (with --island chain and one --mode: one case, "
                        "as a report's replay line runs it)")
    s.add_argument("--tp", type=count(1, 64), default=1, help="tensor-parallel ranks (island forced_comm only)")
    s.add_argument("--steps", type=count(1, MAX_STEPS), default=None,
                   help=f"scheduler steps of the seeded sequence (default 200; 1..{MAX_STEPS}, more belongs in a "
                        "--sequence file). A shorter run is the first steps of a longer one with the same --seed, "
                        "so a divergence at step 12 of a 30-step run is the last step of a 13-step run")
    s.add_argument("--seed", type=seed, default=None, help=f"seed of the request sequence (default 0; 0..{MAX_SEED})")
    _spec(s, "draft tokens a decode carries (speculative decoding; 0..4). Default: the plan's own, K=0 and K=2 "
             "rows, and each hazard's (a hazard of 1+K-token dispatch runs at K=2); given, every case runs at K")
    _block(s, BLOCK_HELP + " (the plan's rows whose K is N or more are left out)")
    s.add_argument("--sequence", type=path, help="replay this request sequence (JSON, e.g. from `repro hunt --save`); "
                   "not with --steps or --seed, which make the seeded sequence; the file's spec_tokens, block_size "
                   "and stack (a hunt's) are the run's")
    s.add_argument("--trace", type=path, help="write per-step digests here (JSON lines), streamed into a temporary file "
                   "beside it and renamed when the run completes (an interrupted run leaves the old file). Only "
                   "the chain islands write trace lines: --island moe and forced_comm refuse --trace")
    s.add_argument("--strict", action="store_true",
                   help="batch variance and kernel nondeterminism fail the run too (default: reported, exit 0)")
    s.add_argument("--no-amplify", action="store_true", help="leave stream races to their natural timing "
                   "(default: poison what an early read sees and delay the producer, so they happen every step)")
    s.add_argument("--reference-every", type=count(0), default=None, metavar="N",
                   help="step the independent third copy (own weights, reference kernels) every N steps, and at "
                        "every step where eager and replay differ; it names the copy that departed and finds faults "
                        "both copies share (default: 1 on the CPU, 16 on a GPU; 0: off)")


BLIND_HELP = ("a blind hunt: no --hazard searches the stack profile (--stack S, fixed by default) as it is (K=2 "
              "drafts unless --spec-tokens; every graph mode the profile runs, each sequence drawing one, unless "
              "--mode); each distinct failure is shrunk and reported with the mode it ran in, then each rule where S "
              "departs from the fixed form is set to its fixed form and the minimal sequence rerun, naming the rule "
              "at fault and the upstream issue it maps to, or saying that no known rule explains it, with the rules "
              "in force: a candidate upstream report. Every hunt prints the seconds to its first failure and to "
              "its minimal sequence.")


def _hunt(sub, raw) -> None:
    s = sub.add_parser("hunt", help="search request sequences for one where replay differs from eager, and shrink "
                       "it to a minimal one (blind, on a serving stack's own rules: --stack)",
                       formatter_class=raw, epilog=BLIND_HELP + "\n" + knobs_help(HUNT_EXIT))
    _common(s)
    s.add_argument("--island", default="all", help="all (the chain) | submod0 | gdn_core | submod1 | moe")
    s.add_argument("--max-examples", type=count(1), default=None, metavar="N",
                   help="the distinct sequences the hunt may run, shrinking included: the search and the shrinking "
                        "of what it found share N (default: the profile's, or 60 without --profile); a sequence "
                        "seen before may run again (Hypothesis replays the minimal one, which shows a flaky "
                        "failure), and one more run replays the cut minimal sequence for the result file")
    s.add_argument("--profile", default=None, choices=["ci", "dev", "soak"],
                   help="ci: 25 derandomised; dev: 150; soak: 5000 (database under $REPRO_CACHE)")
    _spec(s, "draft tokens a decode carries in the sequences drawn (default: the hazards' own; a blind hunt, "
             "no --hazard, draws K=2)")
    _block(s, BLOCK_HELP)
    s.add_argument("--save", type=path, help="where to save the minimal sequence (default: $REPRO_CACHE/hunts/"
                                             "ISLAND-HAZARD-MODE.json; a blind hunt of every mode: MODE is every-mode)")
    s.add_argument("--coverage", action="store_true",
                   help="after the hunt, print how many steps of its sequences reached each state of the control "
                        "rules and the scheduler (repro/search/edges.py); 0 is a state never reached")


def _model(sub) -> None:
    from ..model.config import PRESETS
    s = sub.add_parser("make-tiny", help="write a checkpoint with random weights in the real Quark W8A8 layout "
                       "(to run the suite without the real model)")
    s.add_argument("dir", type=path, help="a new or empty directory, in a folder that exists")
    s.add_argument("--seed", type=seed, default=0, help=f"seed of the random weights (0..{MAX_SEED})")
    s.add_argument("--preset", default="tiny", choices=["tiny", "real-layer", "qwen3.6-35b-a3b"],
                   help="tiny (runs in ms on a CPU), real-layer (real dimensions, 4 layers, 4096 vocab) or the "
                        "full qwen3.6-35b-a3b text model (tens of GiB: refused when memory is short)")
    s.add_argument("--quantised", default="production", choices=["production", "experts", "none"],
                   help="production: every linear W8A8 but the routers and lm_head; experts: routed experts only; "
                        "none: BF16")
    s.add_argument("--naming", default="split", choices=["split", "fused"],
                   help="GDN projections split (Qwen3.5/3.6) or fused qkvz/ba (Qwen3-Next)")
    s.add_argument("--experts", default="per_expert", choices=["per_expert", "fused"],
                   help="routed experts one tensor each, or fused gate_up_proj/down_proj stacks")
    units = ", ".join(f"1..{c.num_hidden_layers + 2} for {name}" for name, c in PRESETS.items())
    s.add_argument("--shards", type=count(1), default=1,
                   help=f"safetensors files (an index when > 1): each holds at least one of the preset's layers, "
                        f"its embedding or its head ({units})")

    s = sub.add_parser("inspect", help="what a checkpoint holds: layers and types, quant scheme, bytes, and every "
                       "tensor checked as `run` checks it")
    s.add_argument("model", type=path, help="checkpoint directory")
    s.add_argument("--json", action="store_true", help="print JSON instead of the table")


def _report(sub) -> None:
    s = sub.add_parser("report", help="an upstream bug report from a run or hunt result: REPORT.md, env.txt and a "
                       "standalone script that needs only torch")
    s.add_argument("result", type=path, help="a `repro run --json` or `repro hunt` result file")
    s.add_argument("-o", "--output", type=path, required=True, metavar="DIR",
                   help="the report directory: new or empty (or one repro wrote, with --force)")
    s.add_argument("--force", action="store_true", help="replace what repro wrote in DIR before, keep the rest")
    s.add_argument("--case", type=count(0), default=None, help="which result row (default: the first divergence)")
    s.add_argument("--layer", type=count(0), default=None,
                   help="the --layer the result was run with (default: first GDN)")
    s.add_argument("--sentinel", type=count(-1, 0), default=None, metavar="0|-1",
                   help="the --sentinel the result was run with")
    s.add_argument("--seed", type=seed, default=0, help=f"seed of the standalone script's random weights (0..{MAX_SEED})")
    s.add_argument("--weights", choices=["auto", "seed", "embed"], default="auto",
                   help="standalone weights: seeded if that reproduces (auto), always seeded, or embedded")
    s.add_argument("--no-verify", action="store_true", help="do not run the standalone script here")
    from ..knobs.stacks import STACKS
    s.add_argument("--stack", default=None, choices=list(STACKS),
                   help="the stack profile the report states (default: the result's own)")
    s.add_argument("--control", default=None, choices=["mirror", "vllm", "vllm-v2"],
                   help="the control source the report states (default: the result's own); " + CONTROL_HELP)
    s.add_argument("--patch", action="append", default=None, metavar="FILE",
                   help="the patch files the report states (default: the result's own); " + PATCH_HELP)


def _bench(sub) -> None:
    s = sub.add_parser("bench", help="time replay against eager and against the bandwidth floor, and what each "
                       "repair costs")
    s.add_argument("--model", type=path, help="checkpoint directory (default: a synthetic one of --preset)")
    s.add_argument("--preset", default="tiny", choices=["tiny", "real-layer"],
                   help="synthetic checkpoint when no --model: tiny (embedded) or real-layer (real dimensions)")
    s.add_argument("--device", default="auto", help="auto | cpu | cuda | xpu")
    _plugin(s, "$REPRO_KERNELS / --kernels")
    s.add_argument("--island", default="all", help="all | chain | submod0 | gdn_core | submod1 | moe")
    s.add_argument("--mode", type=mode, default=None, help="chain capture mode, one that captures graphs: " + MODE_HELP)
    _stack(s)
    _control(s)
    _spec(s, "with --hunt-rates: the draft tokens a decode carries in every hunt (default: each hazard's own K); "
             "with --lockstep-rates: the chain cases run again at K, beside K=0")
    _block(s, "with --hunt-rates: " + BLOCK_HELP + " (hazards that need drafts are skipped)")
    s.add_argument("--hunt-rates", action="store_true",
                   help="also: for each bug of the public record, seconds to the first failing sequence and to the "
                        "minimal one, told (--hazard, fixed stack) and blind (no hazard, on the first stack profile "
                        "that departs from the fixed form in one of its rules; with --stack S, on S only)")
    from ..control.dispatch import PLATFORM_CEILING
    s.add_argument("--batches", default="1,8,32", help=f"decode batch sizes, comma-separated, each "
                   f"1..{PLATFORM_CEILING} (vLLM's largest capture size)")
    s.add_argument("--iters", type=count(1), default=50, help="timed samples per measurement (median)")
    s.add_argument("--warmup", type=count(0), default=5, help="untimed calls before the samples")
    s.add_argument("--kernels", default=None, help="kernel providers, e.g. all=triton (as $REPRO_KERNELS)")
    s.add_argument("--seed", type=seed, default=0, help=f"seed of the inputs (0..{MAX_SEED})")
    s.add_argument("--no-repairs", action="store_true", help="skip the repair-cost rows")
    s.add_argument("--no-tiny-rates", action="store_true",
                   help="skip the CPU tiny checkpoint's lockstep steps/s and Hypothesis examples/s")
    s.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    s.add_argument("--profile", type=count(1), default=None, metavar="N",
                   help="also profile N replays of each chain row: where the time goes, kernel by kernel")
    s.add_argument("--json", type=path, help="write results here")
    s.add_argument("--plot", type=path, help="write a PNG of replay/eager and replay/floor here (needs matplotlib)")
    s.add_argument("--lockstep-rates", action="store_true",
                   help="also: checked lockstep steps/s per island (whole-state and weight checks on), the two "
                        "copies with nothing checked (the floor), hunt examples/s at this checkpoint and device, "
                        "and where a step's time goes")
    s.add_argument("--lockstep-steps", type=count(1), default=400, help="steps a lockstep-rates case (default 400)")
    s.add_argument("--hunt-examples", type=count(0), default=20,
                   help="Hypothesis examples for the hunt rate; with --hunt-rates, the bound of each hunt, its "
                        "shrinking included (default 20)")
    s.add_argument("--reference-every", type=counts(1), default=None, metavar="N[,N...]",
                   help="the lockstep-rates' third-copy rows at these cadences, one row each, so a cadence's cost "
                        "is read off one run (default: the device's, 1 on the CPU and 16 on a GPU)")


def _conform(sub) -> None:
    from ..conform.budget import Budget
    from ..knobs.stacks import STACKS
    s = sub.add_parser("conform", help="the mirror's control rules against the installed vLLM's own code (needs "
                                       "vLLM: tox -e vllm033 or vllm026)")
    s.add_argument("--stack", default=None, choices=list(STACKS),
                   help="the stack profile whose rules the mirror runs (default: the one that claims the installed "
                        "release; another one is a negative control)")
    s.add_argument("--cases", type=count(1), default=Budget.cases,
                   help=f"runner configurations of the dispatch family ({Budget.cases})")
    s.add_argument("--sequences", type=count(1), default=Budget.sequences,
                   help="request sequences for each K (0..3) and block size of the step families, three times as "
                        f"many for the input batch ({Budget.sequences})")
    s.add_argument("--seed", type=count(0), default=0, help="the inputs' seed (the same seed draws the same inputs)")
    s.add_argument("--json", help="write the result here")
    s.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def parser(description: str | None = None) -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    p = Parser(prog="repro", description=description, formatter_class=raw)
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser, title="commands", metavar="COMMAND")
    s = sub.add_parser("env", help="what this machine offers: torch build, devices, graph providers, optional "
                       "packages (run it first, and attach it to a bug report)")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    _model(sub)
    _run(sub, raw)
    _hunt(sub, raw)
    _report(sub)
    _bench(sub)
    _conform(sub)
    return p
