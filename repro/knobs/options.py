"""The typed options a hazard or a repair flips. Runner, islands and the TP slice read these and
never a hazard's name: `hazards.py` is the one table that says which knob sets which option.

Four small frozen dataclasses, one per layer that behaves differently:
- `IslandOptions`: what the model's own code does (both copies, or the replay copy only for what a
  compiler does to a captured piece);
- `RunnerOptions`: how the graph runner pads, holds, copies, pools, replays and reads back;
- `CommOptions`: how the tensor-parallel slice places and feeds its all-reduce;
- `ControlRules`: how the runner's control path decides (uniform decode, the builder's classes, the
  block table's rows, dummy runs), each rule as a vLLM release has it or as its fix has it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields, replace


class Pad(str, enum.Enum):
    """What a padded row of the static metadata buffers carries."""
    SENTINEL = "sentinel"  # the kernel's own sentinel (nano-vllm's `slot_mapping.fill_(-1)`)
    STALE = "stale"  # whatever the last step left there
    OTHER = "other"  # the other sentinel (0 where the kernel skips -1, -1 where it skips 0)


class HostCopy(str, enum.Enum):
    """How the host reads the last piece's outputs."""
    DIRECT = "direct"  # reads the device tensors (ordered by the stream)
    ASYNC = "async"  # a non-blocking copy into pinned memory, read at once (races the copy)
    ASYNC_SYNCED = "async-synced"  # the same copy, then a synchronize before the read


@dataclass(frozen=True)
class IslandOptions:
    escape_z: bool = False  # submod0's z projection runs on a queue the capture does not follow
    undeclared_decode: bool = False  # the GDN decode op's schema does not declare its state write
    fresh_core_out: bool = False  # the splitting op returns a fresh tensor, not its core_out buffer
    reinplace_residual: bool = False  # submod1 adds into graph 0's `residual` in place
    trim_moe_to_context: bool = False  # the MoE trims rows to the forward context's token count


@dataclass(frozen=True)
class RunnerOptions:
    pad: Pad = Pad.SENTINEL
    weak_first_output: bool = False  # graph 0's outputs held by weak reference in the shared pool
    private_pool: bool = False  # graph 1 captured into a pool of its own
    clone_outputs: bool = False  # graph 0's outputs copied to runner-owned buffers after replay
    copy_inputs: bool = False  # a fresh tensor from the splitting op copied into graph 1's input
    recapture: bool = False  # a frozen forward-context value that changed triggers a new capture
    side_stream: bool = False  # graphs replay on a side stream
    event_wait: bool = False  # the main stream waits on an event recorded after the side replay
    host_copy: HostCopy = HostCopy.DIRECT
    relaxed_capture: bool = False  # CUDA capture_error_mode="relaxed" (work on other streams is legal)
    eager_families: frozenset = frozenset()  # island families that run eagerly between graphs
    # Race amplification (`race.py`): a side-stream replay or an async output copy poisons what an
    # early reader would see and delays its producer by `amplify_us` of device work, so the race
    # is forced on every step; a correct ordering reads the real values. Off: natural detection.
    amplify: bool = True
    amplify_us: int = 5000
    # The capture-time lint (`graphs/lint.py`) also watches the splitting op, which runs eagerly
    # between the graphs: at its first call of each kind (decode, prefill, mixed), then every
    # `lint_every` steps (0: first calls only), so an op that goes wrong later is still seen.
    lint_every: int = 64


@dataclass(frozen=True)
class CommOptions:
    noop_capture: bool = False  # the communicator does nothing while a capture is in progress
    eager_split: bool = False  # the all-reduce runs eagerly after each replay, not in the graph
    registered: bool = False  # a registered-buffer all-reduce, overlapped with the next step
    clone_input: bool = False  # the registered buffer is snapshotted at issue time
    eager_after_replay: bool = False  # an eager all-reduce follows each replayed captured one

    @property
    def mode(self) -> str:
        """The replay copy's comm mode (`islands/forced_comm.py` describes each)."""
        if self.registered:
            return "registered"
        if self.eager_split:
            return "eager-split"
        return "noop-capture" if self.noop_capture else "in-graph"


class UniformDecode(str, enum.Enum):
    """When the runner calls a batch a uniform decode (and so may replay the FULL decode graph)."""
    # vLLM 0.33.0 `vllm/v1/worker/gpu_model_runner.py: GPUModelRunner._is_uniform_decode`: by shape
    # alone, the largest query is 1+k and every request has it
    SHAPE = "shape"
    # vLLM PR #53059: the shape test, and every request past its prompt
    PAST_PROMPT = "past-prompt"
    # vLLM PR #47123: the shape test, but never for a hybrid model's batch with a request in its prompt
    NO_HYBRID_PREFILL = "no-hybrid-prefill"
    # vLLM PR #51865 (merged; the V2 runner's `gather_batch_req_state`, `decode_graph_eligible`): the
    # shape test, and no request in its prefill phase (num_computed < prefill_len, which counts a
    # preempted request's recompute of its generated tokens), except a row of one new token over
    # existing context. PR #53059's num_prompt_tokens misses that recompute: a resumed request's last
    # chunk of 1+k tokens past its prompt is a uniform decode there (found by a soak of this suite).
    PHASE_AWARE = "phase-aware"


class FirstChunk(str, enum.Enum):
    """How the GDN metadata builder classes a one-token query (`vllm/v1/attention/backends/gdn_attn.py:
    GDNAttentionMetadataBuilder.build`, the non-spec split)."""
    # vLLM 0.26.0: `split_decodes_and_prefills(m, decode_threshold=1)`: a one-token row is a decode,
    # a request's one-token first chunk included (it then reads its block's old state)
    QUERY_LEN = "query-len"
    # vLLM 0.33.0 (vLLM #51565): a one-token first chunk with no prior state is a prefill
    IS_PREFILLING = "is-prefilling"


@dataclass(frozen=True)
class ControlRules:
    """The decode control path's rules, each as one vLLM release has it or as its fix has it; the
    defaults are the fixed forms (`control/` mirrors each, citing the function it reads)."""
    uniform_decode: UniformDecode = UniformDecode.PHASE_AWARE
    # vLLM PR #55123: a FULL replay of a batch with a request still in its prompt raises instead
    assert_full_past_prompt: bool = True
    first_chunk: FirstChunk = FirstChunk.IS_PREFILLING
    # `vllm/v1/worker/gpu_input_batch.py: InputBatch.remove_request` clears a finished request's
    # block-table row (`BlockTable.clear_row`; vLLM #37728)
    clear_finished_row: bool = True
    # `vllm/v1/worker/gpu_model_runner.py: _dummy_run` commits the block table for its padded rows
    # before building metadata (vLLM #37728)
    dummy_commits_block_table: bool = True
    # `vllm/v1/worker/block_table.py: BlockTable.move_row` zeroes the row it moved (vLLM #49757)
    move_row_zeroes_source: bool = True
    # `_dummy_run` builds a FULL dummy run's metadata as for capture, re-staging the builder's
    # persistent buffers (`for_cudagraph_capture=... or cudagraph_runtime_mode == FULL`; vLLM #49757)
    dummy_restages: bool = True
    # `vllm/v1/worker/gpu_model_runner.py: GPUModelRunner._prepare_inputs` counts a one-token row past
    # its prompt with no drafts as a spec row with 0 drafts, so the GDN builder applies its accepted
    # offset (0.33.0); vLLM 0.26.0 leaves it -1, a non-spec row
    zero_draft_spec_row: bool = True
    # `vllm/config/vllm.py: VllmConfig._set_cudagraph_sizes` adds the uniform-decode sizes to the default
    # capture list (n*(1+K) for request counts n up to max_num_seqs; max_num_seqs itself at K = 0:
    # 0.33.0); vLLM 0.26.0's default list is the token grid and the step budget alone
    decode_capture_sizes: bool = True


@dataclass(frozen=True)
class Options:
    """Everything a case's knobs change. `kernel_sentinel` None keeps the run's own sentinel."""
    eager_island: IslandOptions = field(default_factory=IslandOptions)
    replay_island: IslandOptions = field(default_factory=IslandOptions)
    runner: RunnerOptions = field(default_factory=RunnerOptions)
    comm: CommOptions = field(default_factory=CommOptions)
    control: ControlRules = field(default_factory=ControlRules)
    kernel_sentinel: int | None = None

    def sentinel(self, default: int) -> int:
        return default if self.kernel_sentinel is None else self.kernel_sentinel


_PARTS = {"island": IslandOptions, "runner": RunnerOptions, "comm": CommOptions, "control": ControlRules}


def validate(sets: dict) -> dict:
    """Refuse (at import) a table row that names an option no dataclass has."""
    for key in sets:
        part, _, name = key.partition(".")
        if part == "kernel_sentinel" and not name:
            continue
        cls = _PARTS.get(part)
        if cls is None or name not in {f.name for f in fields(cls)}:
            raise ValueError(f"no option {key!r}")
    return sets


def _set(obj, name, value):
    old = getattr(obj, name)
    if isinstance(old, frozenset):
        value = old | frozenset(value)
    return replace(obj, **{name: value})


def apply(opts: Options, sets: dict, replay_only: bool = False) -> Options:
    """`opts` with the settings of one table row applied (sets of families are unioned)."""
    for key, value in sets.items():
        part, _, name = key.partition(".")
        if part == "kernel_sentinel":
            opts = replace(opts, kernel_sentinel=value)
        elif part == "island":
            if not replay_only:
                opts = replace(opts, eager_island=_set(opts.eager_island, name, value))
            opts = replace(opts, replay_island=_set(opts.replay_island, name, value))
        else:
            opts = replace(opts, **{part: _set(getattr(opts, part), name, value)})
    return opts
