"""Hypothesis hunting: request-sequence strategies, a stateful scheduler machine, and the
`repro hunt` command that shrinks a divergence (or a finding) to a minimal, replayable sequence.

Profiles are registered when asked (`register_profiles`), not at import, and every database lives
under the cache directory (`repro.io.cache_dir`), never in the working directory."""
from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import Flaky

from ..errors import BadInput
from ..io import cache_dir, check_output_file, write_json
from ..scheduler.sequence import Sequence
from .strategies import sequences, size_of, space_for

PROFILES = ("ci", "dev", "soak")
DEFAULT_MAX_EXAMPLES = 60  # without --profile and without --max-examples


def database() -> DirectoryBasedExampleDatabase:
    return DirectoryBasedExampleDatabase(str(cache_dir() / "hypothesis"))


def register_profiles() -> None:
    """ci (derandomised, 25 examples, no database), dev (150) and soak (5000)."""
    common = dict(deadline=None, suppress_health_check=list(HealthCheck), database=database())
    settings.register_profile("ci", max_examples=25, derandomize=True, print_blob=False,
                              **{**common, "database": None})
    settings.register_profile("dev", max_examples=150, **common)
    settings.register_profile("soak", max_examples=5000, **common)


class FlakyHunt(Exception):
    """Hypothesis saw a failure that did not repeat on the same sequence: nondeterminism, which
    the command line reports in one line with exit 1 (something is wrong, not the input)."""


def example_count(max_examples: int | None, profile: str | None) -> int:
    """An explicit --max-examples wins; else the profile's own count (soak: 5000); else 60."""
    if max_examples is not None:
        return max_examples
    if profile is not None:
        register_profiles()
        return settings.get_profile(profile).max_examples
    return DEFAULT_MAX_EXAMPLES


def hunt(check, max_examples: int | None = 60, profile: str | None = None, vocab: int = 512, num_slots: int = 4,
         max_requests: int = 5, max_tokens: int = 8, max_prompt: int | None = None):
    """Search sequences for one where `check(seq)` returns a divergence; return the shrunk
    (sequence, divergence) or (None, None). `max_examples` None: the profile's own count (so
    `--profile soak` means 5000), or DEFAULT_MAX_EXAMPLES without a profile. Raises FlakyHunt
    when a failure does not reproduce (nondeterminism is itself worth reporting, in one line)."""
    found: list = []
    if profile is not None:
        register_profiles()
        base = settings.get_profile(profile)
    else:
        base = settings(database=database())
    n = example_count(max_examples, profile)

    @settings(base, max_examples=n, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink])
    @given(sequences(max_requests, max_tokens, num_slots, vocab, max_prompt))
    def prop(seq):
        div = check(seq)
        if div is not None:
            found.append((seq, div))
            raise AssertionError(div.line())

    try:
        prop()
    except Flaky as e:
        last = found[-1][1].line() if found else str(e).splitlines()[0]
        raise FlakyHunt(f"hunt: a failure did not reproduce on the same sequence (nondeterministic): {last}") from None
    except AssertionError:
        seq, div = found[-1]  # the last failure hypothesis tried is the shrunk one
        return merge_pass(seq, div, check)
    return None, None


def merge_pass(seq: Sequence, div, check):
    """A domain move Hypothesis' shrinker does not make: fold one request's prompt into another's
    (same tokens in the step, one request fewer). Repeated while the divergence persists."""
    improved = True
    while improved and len(seq.requests) > 1:
        improved = False
        for i, j in [(i, j) for i in range(len(seq.requests)) for j in range(len(seq.requests)) if i != j]:
            reqs = [dataclasses.replace(r) for r in seq.requests]
            keep, drop = reqs[i], reqs[j]
            keep.prompt_len = min(seq.max_tokens, keep.prompt_len + drop.prompt_len)
            keep.decode_steps = max(keep.decode_steps, drop.decode_steps)
            cand = dataclasses.replace(seq, requests=[r for k, r in enumerate(reqs) if k != j])
            d = check(cand)
            if d is not None and size_of(cand) <= size_of(seq):
                seq, div, improved = cand, d, True
                break
    return seq, div


@dataclass(frozen=True)
class HuntOptions:
    """What `repro hunt` needs, typed (the argparse Namespace stops at the command line)."""

    checkpoint: Path  # resolved by the caller (the embedded tiny one by default)
    model: str | None = None  # as the user gave it, for the replay line
    device: str = "auto"
    island: str = "chain"
    layer: int | None = None
    mode: str | None = None
    hazards: tuple[str, ...] = ()
    repairs: tuple[str, ...] = ()
    sentinel: int = 0
    max_examples: int | None = None
    profile: str | None = None
    save: str | None = None
    json: str | None = None


class _Found:
    """A finding (an undeclared mutation) as the hunt's target: it has no step, only a line."""

    step = None

    def __init__(self, f: dict):
        self.f = f

    def line(self) -> str:
        return f"finding {self.f['kind']} in {self.f.get('island')}: {self.f['detail']}"


def kernel_sentinel(hazards, sentinel: int) -> int:
    """The pad sentinel the kernels run with: a hazard may force its own (the typed table's
    `sets["kernel_sentinel"]`), and a saved sequence must be scheduled for that one to replay."""
    from ..knobs import hazards as hz
    for h in hazards:
        forced = getattr(hz.HAZARDS[h], "sets", {}).get("kernel_sentinel")
        if forced is not None:
            return forced
    return sentinel


def default_mode(hazards) -> str:
    """piecewise, unless a hazard only exists in full mode (the table's `modes`)."""
    from ..knobs import hazards as hz
    return "full" if any("piecewise" not in hz.HAZARDS[h].modes for h in hazards) else "piecewise"


def save_path(o: HuntOptions, mode: str) -> Path:
    name = f"{o.island}-{'-'.join(o.hazards) or 'baseline'}{''.join('+' + r for r in o.repairs)}-{mode}.json"
    return Path(o.save) if o.save else cache_dir() / "hunts" / name.replace("=", "_").replace("/", "_")


def replay_line(o: HuntOptions, mode: str, save: Path) -> str:
    parts = ["repro", "run", "--mode", mode, "--island", "all" if o.island == "chain" else o.island,
             "--sequence", str(save)]
    if o.model:
        parts += ["--model", o.model]
    if o.device != "auto":
        parts += ["--device", o.device]
    if o.layer is not None:
        parts += ["--layer", str(o.layer)]
    if o.sentinel != 0:
        parts += ["--sentinel", str(o.sentinel)]
    for h in o.hazards:
        parts += ["--hazard", h]
    for r in o.repairs:
        parts += ["--repair", r]
    return " ".join(shlex.quote(p) for p in parts)


def cut_after(minimal: dict, step) -> dict:
    """Steps after the first divergence only lengthen the replay: keep steps 0..step."""
    if step is None or step + 1 >= len(minimal["steps"]):
        return minimal
    return {**minimal, "steps": minimal["steps"][: step + 1]}


HUNT_LINE_EVERY = 10  # without a terminal: one stderr line per this many sequences tried


def progress_of_hunt(label: str, total: int):
    """A callback for each sequence tried: a bar on a terminal, else a line every HUNT_LINE_EVERY
    (shrinking tries more sequences than `total`: the count goes on past it)."""
    import sys

    from ..progress import for_cases
    p = for_cases(1)
    draw = p.start(label)
    count = [0]

    def tried():
        count[0] += 1
        if draw is not None:
            draw(min(count[0], total), total)
        elif count[0] % HUNT_LINE_EVERY == 0:
            print(f"repro: {label}: {count[0]} sequences tried ({total} to search, then shrinking)",
                  file=sys.stderr, flush=True)
    tried.clear = p.clear
    return tried


def hunt_cli(o: HuntOptions) -> tuple[int, dict | None]:
    """`repro hunt`: search, shrink, cut after the divergence, save (the island in the name), and
    print a replay line that keeps every option the run needs. Returns (exit code, result doc):
    1 when something was found."""
    from ..knobs import hazards as hz
    from ..graphs import make_provider
    from ..islands import Model, check_island
    from ..job.cases import Case, run_case
    from ..control.dispatch import DEFAULT_SIZES

    check_island(o.island if o.island != "chain" else "submod0")
    if o.island == "forced_comm":
        raise BadInput("hunt does not search forced_comm (it runs on several ranks): use "
                       "`repro run --island forced_comm --tp N`")
    mode = o.mode or default_mode(o.hazards)
    save = save_path(o, mode)
    check_output_file(save, "--save")
    check_output_file(o.json, "--json")
    provider = make_provider(o.device)
    hz.check(o.hazards, o.repairs, mode, provider.supports_streams, o.island)
    model = Model(o.checkpoint, provider.device, o.layer, island="moe" if o.island == "moe" else "submod0")
    case = Case(o.island, mode, tuple(o.hazards), tuple(o.repairs))

    tried = progress_of_hunt(f"hunt {o.island} {mode} {','.join(o.hazards) or 'baseline'}",
                             example_count(o.max_examples, o.profile))

    def check(seq):
        tried()
        r = run_case(model, provider, case, seq, sentinel=o.sentinel)
        if r.diverged:
            from ..check.compare import Divergence
            fd = r.first_divergence
            return Divergence(fd["step"], fd["island"], fd["tensor"], fd["row"], fd["request"], fd["slot"],
                              fd["max_abs"], fd.get("context", {}))
        if r.detected and r.findings:
            return _Found(r.findings[0])
        return None

    space = space_for(DEFAULT_SIZES)
    try:
        seq, div = hunt(check, o.max_examples, o.profile, vocab=model.cfg.vocab_size, **space)
    finally:
        tried.clear()
    what = f"{', '.join(o.hazards) or 'baseline'}, {o.island}, {mode}"
    if seq is None:
        print(f"nothing found ({what})")
        return 0, None
    eff = kernel_sentinel(o.hazards, o.sentinel)
    minimal = {"requests": [dataclasses.asdict(r) for r in seq.requests], "num_slots": seq.num_slots,
               "max_tokens": seq.max_tokens, "vocab": seq.vocab, "seed": seq.seed,
               "steps": [b.to_json() for b in seq.batches(None if eff == 0 else range(seq.num_slots))]}
    minimal = cut_after(minimal, div.step)
    result = run_case(model, provider, case, Sequence.from_json(minimal), sentinel=o.sentinel)
    import torch
    doc = {"device": str(provider.device), "graph_provider": provider.name, "checkpoint": str(o.checkpoint),
           "torch": torch.__version__, "kernel_sentinel": eff, "minimal_sequence": minimal,
           "results": [result.to_json()], "command": replay_line(o, mode, save)}
    write_json(save, doc, "--save")
    if o.json:
        write_json(o.json, doc)
    print(json.dumps(minimal, indent=None))
    print(f"first {'divergence' if div.step is not None else 'finding'}: {div.line()}")
    print(f"{len(seq.requests)} requests, {len(minimal['steps'])} steps; saved to {save}")
    print(f"replay: {replay_line(o, mode, save)}")
    print(f"hunt ({what}) found: {div.line()}", file=sys.stderr)
    sys.stdout.flush()
    return 1, doc
