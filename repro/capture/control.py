"""Where a runner's control decisions come from: the one injection point of the runners
(`runner.EagerRunner`, `runner.GraphRunner`).

A control path makes every decision vLLM's model runner makes around the islands, and nothing
else: the persistent batch (`_update_states`), the uniform-decode decision and the graph key
(`_determine_batch_execution_and_padding`), the GDN metadata and its persistent buffers
(`_build_attention_metadata`, the builder), the capture-time metadata and a dummy run's
(`_dummy_run`). The runners own the islands, the graphs, the inputs and the replay; they ask their
path and run on what it answers.

Two sources (`knobs.control.Control`), each a `Paths` (`graph(...)` for a replay copy, `eager(...)`
for an eager one) built from the case:

- `MirrorPath` / `MirrorEagerPath`: the suite's mirror (`repro/control`), each rule a setting of
  `ControlRules` (a stack profile, a hazard or a repair sets them). Needs no vLLM.
- the installed vLLM's own code through the seam (`repro.upstream.v1.V1Path`, the V1 model runner,
  and `repro.upstream.v2.V2Path`, the V2 runner), with patch files applied
  (`repro.upstream.patches`).

Every path answers in the mirror's types (`Runtime`, `BatchDescriptor`, `GDNMeta`), so the runners
do not know which one they hold. A graph path's metadata tensors are the views its builder returns:
a FULL graph captured over them reads that builder's own persistent buffers at every replay.
"""
from __future__ import annotations

import numpy as np

from ..control.batch import block_rows
from ..control.builder import Common, GDNMetadataBuilder, common_for, staging_rows
from ..control.dispatch import BatchDescriptor, Dispatcher, configured_sizes, dispatch_step, prefilling
from ..control.input_batch import InputBatch
from ..control.meta import GDNMeta
from ..control.shape import StepShape, decode_len
from ..knobs.control import Control
from ..knobs.modes import GraphMode, Runtime
from ..knobs.options import ControlRules
from ..upstream.paths import VllmPaths


def padded_blocks(live: np.ndarray, pad_rows: int, null: int) -> np.ndarray:
    """`live` block-table rows and `pad_rows` rows of the null block after them (a FULL graph's
    padded requests: `_build_attention_metadata` fills them with `NULL_BLOCK_ID`)."""
    return np.concatenate((live, np.full((pad_rows, live.shape[1]), null, dtype=np.int32)))


class MirrorEagerPath:
    """The eager copy's metadata (and the oracle's padded eager run's): the mirror's builder with no
    FULL graph, so it never stages, over the step's own block rows."""

    source = "mirror"

    def __init__(self, spec_tokens: int, device, sentinel: int, rules: ControlRules = ControlRules()):
        self.k, self.null = spec_tokens, sentinel
        self.builder = GDNMetadataBuilder(spec_tokens, 1, device, full_graphs=False, pad=None, rules=rules)

    def metadata(self, batch, accepted=None, pad_rows: int = 0, size: int | None = None) -> GDNMeta:
        """The step's metadata at its own size, or with `pad_rows` null rows and `size` tokens (the
        shape a FULL replay of it has)."""
        blocks = padded_blocks(block_rows(batch, decode_len(self.k), self.null), pad_rows, self.null)
        return self.builder.build(common_for(batch, blocks, pad_rows, size, accepted, self.builder.rules))


class MirrorPath:
    """The replay copy's control path from the mirror (module docstring): `repro.control`'s
    dispatcher, persistent batch and builder under `rules`, for the step shape `shape` (its capture
    sizes: those asked for, each at most its step budget; none asked: vLLM's default list for its
    `max_num_seqs` and budget); `pad`: what the builder's staging writes past the live rows (None:
    nothing)."""

    source = "mirror"

    def __init__(self, rules: ControlRules, mode: GraphMode, shape: StepShape, device, sentinel: int,
                 pad: int | None):
        self.rules, self.k, self.null, self.mode = rules, shape.spec_tokens, sentinel, mode
        # sizes above the step budget dropped, as vLLM drops them; none configured: vLLM's default list
        sizes = configured_sizes(shape.sizes, shape.max_num_seqs, shape.max_tokens, shape.spec_tokens,
                                 rules.decode_capture_sizes)
        self.dispatcher = Dispatcher(mode, sizes, shape)
        self.sizes = self.dispatcher.sizes
        rows = max(shape.max_num_seqs, max(self.sizes, default=1))
        self.input_batch = InputBatch(rows, shape.decode_len, sentinel, rules)
        self.builder = GDNMetadataBuilder(shape.spec_tokens, staging_rows(shape.max_num_seqs, self.sizes,
                                                                          shape.spec_tokens),
                                          device, full_graphs=mode.has(Runtime.FULL), pad=pad, rules=rules)

    def update(self, batch) -> None:
        """`_update_states`: the persistent batch's rows for this step (`control.input_batch`)."""
        self.input_batch.update(list(zip(batch.request_ids, batch.block_rows())), batch.block_size is not None,
                                set(batch.finished))

    def dispatch(self, batch) -> tuple[Runtime, BatchDescriptor]:
        """The step's runtime mode and graph key (`_determine_batch_execution_and_padding`); a dummy
        step's as `_dummy_run(1+k, uniform_decode=True)` forces it; agreed with the other
        data-parallel rank's batch where the step names it (`dispatch_step`)."""
        return dispatch_step(self.dispatcher, batch, self.rules.uniform_decode)

    def refusal(self, batch, runtime: Runtime, desc: BatchDescriptor) -> str | None:
        """vLLM PR #55123's replay-side assertion, where the rules have it: a FULL dispatch of a batch
        with a request still in its prompt. Beside PR #51865's rule (the fixed stack) it holds out the
        rows that rule holds out, so a one-token chunk over context is no error."""
        if runtime is Runtime.FULL and self.rules.assert_full_past_prompt and any(
                prefilling(self.rules.uniform_decode, batch)):
            return (f"step {batch.step}: a FULL graph ({desc}) was dispatched for a batch with a request still in "
                    "its prompt (the replay-side assertion)")
        return None

    def metadata(self, batch, runtime: Runtime, desc: BatchDescriptor, accepted=None) -> GDNMeta:
        """Commit the block table and build (and, where the builder's rules say, stage) the metadata."""
        ib = self.input_batch
        ib.commit(ib.num_rows)
        pad_rows = desc.num_reqs - batch.num_reqs if runtime is Runtime.FULL else 0
        blocks = padded_blocks(ib.rows(batch.request_ids), pad_rows, self.null)
        size = desc.num_tokens if runtime is Runtime.FULL else batch.num_tokens
        return self.builder.build(common_for(batch, blocks, pad_rows, size, accepted, self.rules))

    def capture_metadata(self, desc: BatchDescriptor) -> GDNMeta:
        """`build_for_cudagraph_capture` over all-zero (null) block-table rows, as at capture."""
        q = np.full(desc.num_reqs, desc.num_tokens // desc.num_reqs, dtype=np.int32)
        blocks = np.full((desc.num_reqs, self.dispatcher.q), self.null, dtype=np.int32)
        return self.builder.build_for_capture(Common(q, q, q > 0, q - 1, q, blocks, desc.num_tokens))

    def dummy(self, desc: BatchDescriptor) -> None:
        """A FULL dummy run's metadata (`_dummy_run(1+k, uniform_decode=True)`): commit the block table
        for the padded rows (`ControlRules.dummy_commits_block_table`), and build as for capture,
        re-staging the builder's buffers from those rows (`dummy_restages`; else they keep the last
        real step's)."""
        ib = self.input_batch
        if self.rules.dummy_commits_block_table:
            ib.commit(desc.num_reqs)
        if self.rules.dummy_restages:
            q = np.zeros(desc.num_reqs, dtype=np.int32)
            q[0] = self.dispatcher.q
            self.builder.build_for_capture(Common(q, q, q > 0, q - 1, q, ib.committed[:desc.num_reqs],
                                                  desc.num_tokens))

    def pad_state_indices(self, batch, desc: BatchDescriptor) -> list[int]:
        """What the persistent state-index buffer holds in this FULL step's padded rows."""
        buf = self.builder.spec_state_indices[:, 0] if self.k else self.builder.non_spec_state_indices
        return buf[batch.num_reqs:desc.num_reqs].tolist()


class MirrorPaths:
    """The mirror's paths under `rules` (what a runner builds when given none). A context manager,
    as `VllmPaths` is, with nothing to set up."""

    source = "mirror"

    def __init__(self, rules: ControlRules = ControlRules()):
        self.rules = rules

    def __enter__(self) -> "MirrorPaths":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def graph(self, mode: GraphMode, shape: StepShape, device, sentinel: int, pad: int | None) -> MirrorPath:
        return MirrorPath(self.rules, mode, shape, device, sentinel, pad)

    def eager(self, spec_tokens: int, device, sentinel: int) -> MirrorEagerPath:
        return MirrorEagerPath(spec_tokens, device, sentinel, self.rules)


def paths_for(control: Control, rules: ControlRules, checkpoint, block_size: int | None = None):
    """A case's paths: the mirror's under `rules`, or the installed vLLM's (`upstream.paths.VllmPaths`:
    enter it for the case's length, which loads vLLM and applies the patch files)."""
    if not control.upstream:
        return MirrorPaths(rules)
    return VllmPaths(control, checkpoint, block_size)
