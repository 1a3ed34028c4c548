"""Graph modes, capture sizes and the dispatcher: the mirror (`repro.knobs.modes.resolve`,
`repro.control.dispatch`) against vLLM's `CompilationConfig` and `CudagraphDispatcher` under the same
`VllmConfig` (`repro.upstream.dispatch`), over drawn runner configurations.

Per case: the mode each side resolves; with no sizes given, the default list (`VllmConfig.
_set_cudagraph_sizes` against `default_capture_sizes`); the sizes the runner captures, spec-rounded
(`adjust_cudagraph_sizes_for_spec_decode` against the mirror's `Dispatcher.sizes`, built as
`GraphRunner` builds it); every key; then `dispatch` of every token count from 1 to two past the
largest size, as a uniform decode and not.
"""
from __future__ import annotations

from ..control.dispatch import Dispatcher as Mirror, configured_sizes, default_capture_sizes
from ..knobs.modes import parse_mode, resolve
from ..upstream.config import vllm_config
from ..upstream.dispatch import Dispatcher
from ..control.shape import StepShape
from .result import RuleResult

RULES = {
    "mode": ("config/compilation.py: CompilationConfig.resolve_cudagraph_mode_and_sizes",
             "repro/knobs/modes.py: resolve"),
    "default sizes": ("config/vllm.py: VllmConfig._set_cudagraph_sizes", "repro/control/dispatch.py: default_capture_sizes"),
    "capture sizes": ("config/compilation.py: CompilationConfig.adjust_cudagraph_sizes_for_spec_decode",
                      "repro/control/dispatch.py: capture_sizes (Dispatcher.sizes)"),
    "keys": ("v1/cudagraph_dispatcher.py: CudagraphDispatcher.initialize_cudagraph_keys",
             "repro/control/dispatch.py: Dispatcher.__init__"),
    "dispatch": ("v1/cudagraph_dispatcher.py: CudagraphDispatcher.dispatch", "repro/control/dispatch.py: Dispatcher.dispatch"),
}


def results() -> dict[str, RuleResult]:
    return {r: RuleResult(r, *RULES[r]) for r in RULES}


def mirror_dispatcher(case, rules) -> Mirror:
    """The mirror's dispatcher as `GraphRunner.__init__` builds it for the case under `rules`."""
    sizes = configured_sizes(case.sizes, case.max_num_seqs, case.max_num_batched_tokens, case.spec_tokens,
                             rules.decode_capture_sizes)
    return Mirror(parse_mode(case.mode), sizes, StepShape(case.spec_tokens, case.max_num_seqs))


def compare_case(up, case, rules, out: dict[str, RuleResult], max_tokens: int = 600) -> None:
    """Every rule of this family for one case under the profile's `rules`, into `out` (`results()`)."""
    label = case.label()
    try:
        d = Dispatcher(up, vllm_config(up, case))
    except ValueError as e:  # a configuration vLLM refuses at start-up (pydantic raises ValueErrors): nothing to compare
        for r in out.values():
            r.refuse(f"{label}: {type(e).__name__}: {e}")
        return
    m = mirror_dispatcher(case, rules)
    out["mode"].compare(label, {"mode": (d.mode.name, resolve(case.graph_mode).name)})
    graphs = d.mode.name != "NONE"
    if case.sizes is None and graphs:
        ours = default_capture_sizes(case.max_num_seqs, case.max_num_batched_tokens, case.spec_tokens,
                                     rules.decode_capture_sizes)
        out["default sizes"].compare(label, {"sizes": (d.asked, ours)})
    if graphs:
        out["capture sizes"].compare(label, {"sizes": (d.sizes, m.sizes)})
    out["keys"].compare(label, {"keys": (sorted(map(str, d.keys.items())), sorted(map(str, m.keys.items())))})
    top = min(max(d.sizes or m.sizes or (1,)) + 2, max_tokens)
    r = out["dispatch"]
    for n in range(1, top + 1):
        for uniform in (False, True):
            theirs, ours = d.dispatch(n, uniform), m.dispatch(n, uniform)
            r.compare(lambda: f"dispatch({n}, uniform={uniform}) under {label}",
                      {"runtime": (theirs[0], ours[0]), "key": (theirs[1], ours[1])})


def run(up, cases, rules) -> list[RuleResult]:
    out = results()
    for case in cases:
        compare_case(up, case, rules, out)
    return list(out.values())


__all__ = ["run", "compare_case", "results", "mirror_dispatcher"]
