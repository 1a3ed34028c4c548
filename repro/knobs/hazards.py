"""The hazard and repair knobs (docs/DESIGN.md's table), as data plus the one option each flips.

A hazard is a faithful mechanism by which replay can diverge from eager; a repair is what a
serving stack can do about it. Each row names the typed options it sets (`options.py`); runner,
islands and the TP slice read those options, never a name. `options_for(hazards, repairs)` applies
the hazards' settings, then the repairs' (a repair wins). Everything else a caller needs — modes,
islands, expectations, the kernel sentinel, which standalone script can rebuild it — is a field of
the row, so no rule is re-derived elsewhere.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import Refused
from ..graphs.lint import UNDECLARED
from .modes import Runtime, parse_mode
from .options import FirstChunk, HostCopy, Options, Pad, UniformDecode, apply, validate
from .stacks import differs
from .stacks import stack as _stack

CHAIN_ISLANDS = ("chain", "submod0", "gdn_core", "submod1")
# The graphs a hazard needs: PIECEWISE pieces, or a FULL graph of the decode chain.
GRAPHS = ("piecewise", "full")


def needs_met(needs, mode: str) -> bool:
    """Whether graph mode `mode` has the graphs a hazard or repair `needs`."""
    m = parse_mode(mode)
    return any(m.has(Runtime.FULL if n == "full" else Runtime.PIECEWISE) for n in needs)


def home(mode: str) -> str | None:
    """Where a default run plants the hazards of mode `mode`: FULL decode graphs ("full"), pieces
    only ("piecewise"), or nothing (NONE)."""
    m = parse_mode(mode)
    if m.decode is Runtime.FULL:
        return "full"
    return "piecewise" if m.has(Runtime.PIECEWISE) else None


@dataclass(frozen=True)
class Repair:
    name: str
    what: str
    sets: dict = field(default_factory=dict)
    device_only: bool = False  # needs streams: the CPU tape has none
    piecewise_only: bool = False  # an eager family inside a full-mode graph cannot run eagerly
    standalone: bool = False  # the standalone report script rebuilds it
    leaves: str = "clean"  # what a case with the repair ends as: "clean", or "finding" (a loud error)
    cases: str = ""  # the upstream change it mirrors

    def __post_init__(self):
        validate(self.sets)


@dataclass(frozen=True)
class Hazard:
    name: str
    mechanism: str
    repairs: tuple[str, ...]  # any one of these clears it
    sets: dict = field(default_factory=dict)
    modes: tuple[str, ...] = GRAPHS  # the graphs it needs (`needs_met`)
    device_only: bool = False
    islands: tuple[str, ...] = ("chain",)
    detected_as: str = "divergence"  # or "finding"
    finding: str = ""  # the runner finding kind that detects it (detected_as "finding")
    replay_only: bool = False  # a compiler's doing to a captured piece: the eager copy is the reference
    stream: bool = False  # a race between streams or queues
    standalone: bool = False  # the standalone report script rebuilds it
    probe: bool = False  # a probe for an upstream bug with no known repair: a healthy stack stays clean
    cases: str = ""
    # The sequence its case runs: the draft tokens a decode carries, dummy steps of an idle data-parallel
    # rank, and the third copy's cadence (1: every step, for a fault both copies share).
    spec_tokens: int = 0
    data_parallel: bool = False
    reference_every: int | None = None
    record: bool = False  # one of the public record's bugs (`docs/real-bugs.md`)
    script: str = ""  # its torch-only standalone reproducer, a path in the repository
    trigger: str = "replay"  # what the steps must reach for it to show (`job/triggers.py`), or a finding kind
    # Why a fused GDN core (vllm-xpu-kernels' `gdn_attention`: `kernels/gdn/xpu_semantics.py`) refuses this
    # hazard's configuration, its repairs' too ("": it runs it); `docs/real-bugs.md` lists it.
    fused_refused: str = ""
    # How its outcome under the fused GDN core differs from the CUDA kernels' ("": it does not, or no reason
    # is known); `docs/real-bugs.md` writes it beside the differing hunt.
    fused_note: str = ""
    # The pieces it acts in, which must be graphs: an isolated island that runs one of them eagerly
    # (`islands.kinds`: submod0 alone runs submod1 eagerly) cannot show it, so it is refused there.
    pieces: tuple[str, ...] = ()

    def __post_init__(self):
        validate(self.sets)

    @property
    def rules(self) -> tuple[str, ...]:
        """The control rules it sets (`ControlRules` fields)."""
        return tuple(k.partition(".")[2] for k in self.sets if k.startswith("control."))

    def applies_to(self, island: str) -> bool:
        return island in self.islands or (island in CHAIN_ISLANDS and "chain" in self.islands)


HAZARDS: dict[str, Hazard] = {h.name: h for h in [
    Hazard("stale-pad", "padded rows keep the last step's state indices and token ids", ("sanitize-pad",),
           {"runner.pad": Pad.STALE}, modes=("full",), standalone=True, cases="vLLM #37728",
           trigger="stale-pad"),
    Hazard("pad-sentinel-mismatch", "the runner pads state indices with 0, the kernel skips only -1",
           ("sanitize-pad",), {"runner.pad": Pad.OTHER, "kernel_sentinel": -1}, modes=("full",),
           standalone=True, record=True, cases="vLLM #35431, #39064", trigger="padded-replay",
           fused_refused="with the kernel sentinel -1 the capture rows, and the padded rows once `sanitize-pad` "
           "refills them, carry -1, which the XPU recurrence kernels use unchecked: they read and write "
           "ssm_state[-1], outside the cache (on XPU only a real block, vLLM's null block 0, keeps padded rows off "
           "live state)"),
    Hazard("shared-pool-weakref", "graph 0's outputs are held by weak reference in the shared pool, so graph 1's "
           "capture places its tensors over them and a reader of graph 0's outputs sees them overwritten",
           ("private-pool", "clone-outputs"), {"runner.weak_first_output": True}, modes=("piecewise",),
           cases="PyTorch #122192", pieces=("submod0", "submod1")),
    Hazard("output-alias", "graph 1 (reinplaced by a compiler) adds into graph 0's `residual` output in place",
           ("clone-outputs",), {"island.reinplace_residual": True}, modes=("piecewise",), replay_only=True,
           cases="lab notes 2026-06-14i (graph-0 output alias)", pieces=("submod0", "submod1")),
    Hazard("fresh-alloc-split-op", "the eager splitting op returns a fresh tensor; graph 1 reads the captured address",
           ("copy-inputs",), {"island.fresh_core_out": True}, modes=("piecewise",), standalone=True,
           record=True, cases="vLLM #37363, #37361, #37395, #53915", pieces=("submod1",)),
    Hazard("frozen-python-state", "the MoE trims rows to the forward context's token count, a Python int the "
           "graph freezes at capture", ("recapture", "eager-family=moe"), {"island.trim_moe_to_context": True},
           standalone=True, cases="PyTorch #114844, vLLM #51928", trigger="python-state", pieces=("submod1",)),
    Hazard("undeclared-mutation", "the GDN decode op writes ssm_state but its schema declares no mutation",
           ("declare",), {"island.undeclared_decode": True}, detected_as="finding",
           finding=UNDECLARED, cases="torch.library.opcheck", trigger="piecewise-decode"),
    Hazard("side-stream-no-wait", "replay on a side stream, consumer on the main stream without an event",
           ("event-wait",), {"runner.side_stream": True}, device_only=True, stream=True),
    Hazard("async-output-copy", "a non-blocking device-to-host copy of outputs is read before it lands",
           ("sync-output-copy",), {"runner.host_copy": HostCopy.ASYNC}, device_only=True, stream=True,
           cases="lab: VLLM_XPU_SYNC_ASYNC_OUTPUT_COPY"),
    Hazard("escaped-capture", "submod0's z projection is issued on a stream the capture does not follow",
           ("capture-stream", "eager-family=submod0"), {"island.escape_z": True, "runner.relaxed_capture": True},
           modes=("piecewise",), cases="PyTorch #196490, auto-round #2206", trigger="replay-again",
           pieces=("submod0",)),
    Hazard("shape-only-uniform-decode", "with k draft tokens a decode, a prefill chunk of exactly 1+k tokens is "
           "called a uniform decode by shape alone and replayed through the FULL decode graph, whose GDN buffers the "
           "builder stages only for decode batches: the replay reads capture-time or stale state indices, so the "
           "prompt's state is never written (or another request's is overwritten)",
           ("past-prompt-uniform", "no-hybrid-prefill", "replay-assert"),
           {"control.uniform_decode": UniformDecode.SHAPE, "control.assert_full_past_prompt": False},
           modes=("full",), spec_tokens=2, record=True, cases="vLLM #53051, #49918", standalone=True,
           script="repro/report/standalone/vllm_53051.py", trigger="prompt-as-decode",
           fused_note="The FULL graph's spec kernels run the prompt on the capture's null indices, and none skips 0 "
           "(rules 3 and 7): at the first step block 0 still holds zeros, the start a new prompt has, so the output is "
           "right, and every column's state goes to the null block instead of the request's own; its next decode "
           "starts from its never-written block. A later prompt replayed the same way starts from what this one left "
           "in block 0 (`tests/test_xpu_runs.py`)."),
    Hazard("first-chunk-as-decode", "a request's one-token first chunk is classed as a decode, so the decode kernels "
           "continue from its recycled state block instead of starting from zero (both copies alike: the third copy "
           "sees it)", ("is-prefilling-first-chunk",), {"control.first_chunk": FirstChunk.QUERY_LEN},
           reference_every=1, record=True, cases="vLLM #51565 (issue #51562)",
           script="repro/report/standalone/vllm_51565.py", trigger="first-chunk"),
    Hazard("dummy-stale-rows", "an idle data-parallel rank's FULL dummy run builds its metadata from block-table "
           "rows of finished requests, never cleared nor committed, and its replay writes their state blocks, which "
           "later requests own", ("clear-and-commit",),
           {"control.clear_finished_row": False, "control.dummy_commits_block_table": False}, modes=("full",),
           data_parallel=True, record=True, standalone=True, cases="vLLM #37728", trigger="dummy-after-finish"),
    Hazard("dummy-reuses-staging", "a FULL dummy run replays the decode graph without re-staging the builder's "
           "buffers: it reads the last real decode batch's state indices and writes those requests' state with "
           "dummy tokens", ("restage-dummy",), {"control.dummy_restages": False}, modes=("full",),
           data_parallel=True, record=True, standalone=True, cases="vLLM #49757", trigger="dummy-after-decode"),
    Hazard("comm-noop-capture", "the all-reduce is a no-op while capturing, so replay never reduces",
           ("eager-family=comm",), {"comm.noop_capture": True}, islands=("forced_comm",),
           cases="lab: VLLM_XPU_GRAPH_NOOP_COMM_CAPTURE"),
    Hazard("allreduce-no-clone", "a registered-buffer all-reduce reads an input buffer that was overwritten",
           ("clone-input",), {"comm.registered": True}, islands=("forced_comm",), stream=True,
           cases="lab: VLLM_XPU_CUSTOM_ALLREDUCE_CLONE_INPUT=0"),
    Hazard("comm-graph-then-eager", "a replayed captured all-reduce followed by an eager all-reduce", (),
           {"comm.eager_after_replay": True}, islands=("forced_comm",), probe=True, cases="PyTorch #189403"),
]}

REPAIRS: dict[str, Repair] = {r.name: r for r in [
    Repair("sanitize-pad", "padded rows carry the kernel's sentinel, refilled every step", {"runner.pad": Pad.SENTINEL},
           standalone=True),
    Repair("clone-outputs", "graph 0's outputs are copied to runner-owned buffers after each replay",
           {"runner.clone_outputs": True}),
    Repair("private-pool", "graph 1 is captured into a pool of its own; graph 0's outputs are held strongly",
           {"runner.private_pool": True, "runner.weak_first_output": False}),
    Repair("copy-inputs", "a fresh tensor returned by the splitting op is copied into graph 1's input buffer",
           {"runner.copy_inputs": True}, standalone=True),
    Repair("recapture", "a size is captured again when a forward-context value it froze has changed",
           {"runner.recapture": True}, standalone=True),
    Repair("eager-family=moe", "the MoE family (with submod1) runs eagerly between graphs",
           {"runner.eager_families": {"moe"}}, piecewise_only=True, standalone=True),
    Repair("eager-family=submod0", "submod0 runs eagerly; only submod1 is a graph",
           {"runner.eager_families": {"submod0"}}, piecewise_only=True, standalone=True),
    Repair("eager-family=submod1", "submod1 runs eagerly; only submod0 is a graph",
           {"runner.eager_families": {"submod1"}}, piecewise_only=True, standalone=True),
    Repair("eager-family=comm", "the all-reduce runs eagerly after each replay, outside the graph",
           {"comm.eager_split": True}),
    Repair("declare", "the decode op declares the state it writes in `mutates_args`",
           {"island.undeclared_decode": False}),
    Repair("event-wait", "the main stream waits on an event recorded after the side-stream replay",
           {"runner.event_wait": True}, device_only=True),
    Repair("sync-output-copy", "the host synchronises before it reads the copied outputs",
           {"runner.host_copy": HostCopy.ASYNC_SYNCED}, device_only=True),
    Repair("capture-stream", "the escaped work is issued on the capturing stream", {"island.escape_z": False}),
    Repair("clone-input", "the registered all-reduce snapshots its input buffer when it is issued",
           {"comm.registered": True, "comm.clone_input": True}),
    Repair("past-prompt-uniform", "a batch is a uniform decode only when every request is past its prompt",
           {"control.uniform_decode": UniformDecode.PAST_PROMPT}, cases="vLLM PR #53059", standalone=True),
    Repair("no-hybrid-prefill", "a hybrid model's batch with a request in its prompt is never a uniform decode",
           {"control.uniform_decode": UniformDecode.NO_HYBRID_PREFILL}, cases="vLLM PR #47123", standalone=True),
    Repair("replay-assert", "a FULL dispatch of a batch with a request in its prompt raises instead of replaying",
           {"control.assert_full_past_prompt": True}, leaves="finding", cases="vLLM PR #55123"),
    Repair("is-prefilling-first-chunk", "a one-token first chunk with no prior state is a prefill",
           {"control.first_chunk": FirstChunk.IS_PREFILLING}, cases="vLLM #51565"),
    Repair("clear-and-commit", "a finished request's block-table row is cleared, and a dummy run commits its rows",
           {"control.clear_finished_row": True, "control.dummy_commits_block_table": True}, cases="vLLM #37728",
           standalone=True),
    Repair("restage-dummy", "a FULL dummy run builds its metadata as for capture, re-staging the builder's buffers",
           {"control.dummy_restages": True}, cases="vLLM #49757", standalone=True),
]}

# Runner finding kinds that mean a planted hazard was seen (not merely noted, like an alias): a
# hazard's own, a replay the runner's assertion refused (what a "finding" repair leaves), and
# padding poison (non-finite values in padded rows a later piece reads: never silent, though no
# live row differs). Each fails a case that should be clean.
REFUSED = "replay-refused"
PAD_POISON = "pad-poison"
FINDING_KINDS = frozenset(h.finding for h in HAZARDS.values() if h.finding) | {REFUSED, PAD_POISON}

for _h in HAZARDS.values():  # the table is closed: every named repair exists
    assert all(r in REPAIRS for r in _h.repairs), _h.name


def options_for(hazards=(), repairs=(), stack: str = "fixed") -> Options:
    """The options a case runs with: the stack profile's control rules, then the hazards' settings,
    then the repairs' (a repair wins)."""
    opts = Options(control=_stack(stack).rules)
    for h in hazards:
        hz = HAZARDS[h]
        opts = apply(opts, hz.sets, replay_only=hz.replay_only)
    for r in repairs:
        opts = apply(opts, REPAIRS[r].sets)
    return opts


def reference_cadence(hazards=(), stack: str = "fixed") -> int | None:
    """The third copy's cadence a case needs (None: the device's default, `reference_copy.default_every`):
    the closest that a planted hazard asks for, or a hazard whose control rules the stack profile
    carries. A fault both copies share is seen by the third copy alone, so a blind hunt of vllm-0.26
    looks for vLLM #51565 every step without being told of it (on a GPU the default is every 16th)."""
    departs = set(differs(_stack(stack).rules))
    return min((h.reference_every for h in HAZARDS.values() if h.reference_every is not None
                and (h.name in hazards or departs & set(h.rules))), default=None)


def check(hazards, repairs, mode: str, streams: bool, island: str = "chain", eager=frozenset(),
          mode_from: str | None = None) -> None:
    """Refuse a knob that cannot apply to this island, mode or provider (`streams`: the provider
    has device streams; the CPU tape has none). `eager`: the pieces the island runs eagerly around
    it (`islands.kinds`); `mode_from`: where the mode came from, for the message (default: --mode)."""
    for h in hazards:
        if h not in HAZARDS:
            raise Refused(f"unknown hazard {h!r} (known: {', '.join(HAZARDS)})")
        hz = HAZARDS[h]
        if not hz.applies_to(island):
            raise Refused(f"hazard {h} applies to island {'/'.join(hz.islands)}, not {island}")
        eagerly = [p for p in hz.pieces if p in eager]
        if eagerly:
            raise Refused(f"hazard {h} acts in {' and '.join(hz.pieces)} as graphs, and island {island} runs "
                          f"{' and '.join(eagerly)} eagerly (use --island chain): {hz.mechanism}")
        if not needs_met(hz.modes, mode):
            raise Refused(f"hazard {h} needs {' or '.join(hz.modes)} graphs, which {mode_from or '--mode ' + mode} "
                          f"does not capture ({hz.mechanism})")
        if hz.device_only and not streams:
            raise Refused(f"hazard {h} needs streams: the CPU tape has none (use --device cuda or xpu)")
    for r in repairs:
        if r not in REPAIRS:
            raise Refused(f"unknown repair {r!r} (known: {', '.join(REPAIRS)})")
        rep = REPAIRS[r]
        if rep.device_only and not streams:
            raise Refused(f"repair {r} needs streams: the CPU tape has none")
        if rep.piecewise_only and parse_mode(mode).has(Runtime.FULL):
            raise Refused(f"repair {r}: --mode {mode} captures the decode chain as one graph, so no family "
                          "can run eagerly inside it (use --mode piecewise)")


def expectation(hazards, repairs) -> str:
    """What a healthy stack gives for these knobs: "clean", "diverged" or "finding" (a hazard found
    as a runner finding, or one whose repair turns it into a loud error)."""
    def cleared(h):
        return any(r in repairs and REPAIRS[r].leaves == "clean" for r in HAZARDS[h].repairs)

    def loud(h):
        return HAZARDS[h].detected_as == "finding" or any(r in repairs for r in HAZARDS[h].repairs)
    live = [h for h in hazards if not HAZARDS[h].probe and not cleared(h)]
    if not live:
        return "clean"
    return "finding" if all(loud(h) for h in live) else "diverged"


def planted(mode: str, streams: bool, island: str = "chain") -> list[Hazard]:
    """The hazards a default run plants alone on `island` in `mode`."""
    return [h for h in HAZARDS.values() if home(mode) in h.modes and h.applies_to(island) and island in h.islands
            and (streams or not h.device_only)]


def check_comm(hazards, repairs) -> None:
    """Refuse knobs the tensor-parallel slice cannot honour, or that contradict each other."""
    for h in hazards:
        if h not in HAZARDS or not HAZARDS[h].applies_to("forced_comm"):
            mine = ", ".join(h.name for h in planted("piecewise", True, "forced_comm"))
            raise Refused(f"hazard {h!r} does not apply to island forced_comm (its hazards: {mine})")
    for r in repairs:
        if r not in REPAIRS or not any(k.startswith("comm.") for k in REPAIRS[r].sets):
            mine = ", ".join(sorted({x for h in planted("piecewise", True, "forced_comm") for x in h.repairs}))
            raise Refused(f"repair {r!r} does not apply to island forced_comm (its repairs: {mine})")
    c = options_for(hazards, repairs).comm
    if c.registered and (c.noop_capture or c.eager_split):
        raise Refused("the registered-buffer all-reduce (allreduce-no-clone / clone-input) already runs outside the "
                      "graph: it does not combine with comm-noop-capture or eager-family=comm")
    if c.eager_after_replay and (c.registered or c.eager_split or c.noop_capture):
        raise Refused("comm-graph-then-eager needs an all-reduce captured in the graph: plant it alone "
                      "(there is no known repair)")


def cleared_by(hazard: str) -> tuple[str, ...]:
    return HAZARDS[hazard].repairs
