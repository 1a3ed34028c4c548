"""Hypothesis hunting: request-sequence strategies, a stateful scheduler machine, and the
`repro hunt` command that shrinks a divergence to a minimal, replayable sequence."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from .sequence import Request, Sequence


def cache_dir() -> Path:
    return Path(os.environ.get("REPRO_CACHE", Path.home() / ".cache" / "repro"))


def register_profiles() -> None:
    db = DirectoryBasedExampleDatabase(str(cache_dir() / "hypothesis"))
    common = dict(deadline=None, suppress_health_check=list(HealthCheck), database=db)
    settings.register_profile("ci", max_examples=25, derandomize=True, print_blob=False,
                              **{**common, "database": None})
    settings.register_profile("dev", max_examples=150, **common)
    settings.register_profile("soak", max_examples=5000, **common)


register_profiles()


def requests_st(max_requests: int = 5, max_tokens: int = 8, max_decode: int = 6):
    req = st.builds(
        lambda p, d, a, pre: (p, d, a, pre),
        st.integers(1, max_tokens), st.integers(0, max_decode), st.integers(0, 3),
        st.one_of(st.none(), st.integers(1, 3)))
    return st.lists(req, min_size=1, max_size=max_requests).map(
        lambda rs: [Request(i, p, d, a, pre) for i, (p, d, a, pre) in enumerate(rs)])


def sequences(max_requests: int = 5, max_tokens: int = 8, num_slots: int = 4, vocab: int = 512):
    return requests_st(max_requests, max_tokens).map(
        lambda rs: Sequence(rs, num_slots=num_slots, max_tokens=max_tokens, vocab=vocab))


def size_of(seq: Sequence) -> tuple[int, int]:
    return len(seq.requests), len(seq.batches())


def hunt(check, max_examples: int = 60, profile: str | None = None, vocab: int = 512, num_slots: int = 4):
    """Search sequences for one where `check(seq)` returns a divergence; return the shrunk
    (sequence, divergence) or (None, None)."""
    found: list = []

    @settings(settings.get_profile(profile) if profile else settings(), max_examples=max_examples,
              deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink])
    @given(sequences(vocab=vocab, num_slots=num_slots))
    def prop(seq):
        div = check(seq)
        if div is not None:
            found.append((seq, div))
            raise AssertionError(div.line())

    try:
        prop()
    except AssertionError:
        seq, div = found[-1]  # the last failure hypothesis tried is the shrunk one
        return merge_pass(seq, div, check)
    return None, None


def merge_pass(seq: Sequence, div, check):
    """A domain move Hypothesis' shrinker does not make: fold one request's prompt into another's
    (same tokens in the step, one request fewer). Repeated while the divergence persists."""
    import dataclasses
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


def hunt_cli(a) -> int:
    from .cli import _model_path, _write_json
    from .graphs import make_provider
    from .islands import Model
    from .job import Case, run_case

    provider = make_provider(a.device)
    mode = a.mode or ("full" if any(h in ("stale-pad", "pad-sentinel-mismatch") for h in a.hazard) else "piecewise")
    island = "chain" if a.island in ("all", None) else a.island
    from . import hazards as hz
    hz.check(a.hazard, a.repair, mode, provider.supports_streams, island if island != "moe" else "moe")
    model = Model(_model_path(a), provider.device, a.layer, island="moe" if island == "moe" else "submod0")
    case = Case(island, mode, tuple(a.hazard), tuple(a.repair))

    def check(seq):
        r = run_case(model, provider, case, seq, sentinel=a.sentinel)
        if r.diverged:
            from .lockstep import Divergence
            fd = r.first_divergence
            return Divergence(fd["step"], fd["island"], fd["tensor"], fd["row"], fd["request"], fd["slot"],
                              fd["max_abs"], fd.get("context", {}))
        return None

    seq, div = hunt(check, a.max_examples, a.profile, vocab=model.cfg.vocab_size)
    if seq is None:
        print(f"no divergence in {a.max_examples} examples ({', '.join(a.hazard) or 'baseline'}, {mode})")
        return 0
    minimal = {"requests": [r.__dict__ for r in seq.requests], "num_slots": seq.num_slots,
               "max_tokens": seq.max_tokens, "vocab": seq.vocab, "seed": seq.seed,
               "steps": [b.to_json() for b in seq.batches(None if a.sentinel == 0 else range(seq.num_slots))]}
    save = Path(a.save) if a.save else cache_dir() / "hunts" / f"{'-'.join(a.hazard) or 'baseline'}-{mode}.json"
    result = run_case(model, provider, case, Sequence.from_json(minimal), sentinel=a.sentinel)
    doc = {"device": str(provider.device), "graph_provider": provider.name, "checkpoint": str(_model_path(a)),
           "minimal_sequence": minimal, "results": [result.to_json()]}
    import torch
    doc["torch"] = torch.__version__
    _write_json(str(save), doc)
    if a.json:
        _write_json(a.json, doc)
    if a.report:
        from .report import report_hook
        report_hook(doc, a)
    print(json.dumps(minimal, indent=None))
    print(f"first divergence: {div.line()}")
    print(f"{len(seq.requests)} requests, {len(minimal['steps'])} steps; saved to {save}")
    cmd = f"repro run --mode {mode} --island {island if island != 'chain' else 'all'} --sequence {save}"
    cmd += "".join(f" --hazard {h}" for h in a.hazard) + "".join(f" --repair {r}" for r in a.repair)
    print(f"replay: {cmd}")
    sys.stdout.flush()
    return 1
