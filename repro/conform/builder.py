"""The GDN metadata builder on every step of drawn request sequences: the mirror's
(`repro.control.builder.GDNMetadataBuilder`, sized and fed as `GraphRunner` sizes and feeds it)
against vLLM's `GDNAttentionMetadataBuilder` under the same `VllmConfig` (`repro.upstream.builder`).

`ControlPath` walks a sequence as the mirror's runner does (`repro/capture/runner.py: GraphRunner`
and its control path `repro/capture/control.py: MirrorPath`: `update`, `dispatch`, `metadata`,
`capture_metadata`, `dummy`) and hands each build
call, with the same `Common`, to both builders: the step's build; the capture build the first time
a FULL key is used; a FULL dummy run's re-staging build (as the profile's rules say). After each
call it compares the returned metadata (counts, state indices, query start locations,
`has_initial_state`, accepted counts, token indices), whether each returned tensor is a view of
the persistent buffer (staged), and every persistent buffer both keep, over the entries vLLM has
written (`repro.upstream.builder.POISON` marks the rest). It also counts each FULL replay whose
rows vLLM's buffers had never written (what an uninitialised `torch.empty` would hand the graph).
"""
from __future__ import annotations

import numpy as np

from ..control.builder import Common, GDNMetadataBuilder, common_for, staging_rows
from ..control.dispatch import prefilling, uniform_decode
from ..control.input_batch import InputBatch
from ..control.prefix import forward_copies
from ..knobs.modes import Runtime, parse_mode
from ..upstream.builder import BUFFERS, POISON, Builder, fields
from ..upstream.config import vllm_config
from ..upstream.dispatch import Dispatcher
from .dispatch import mirror_dispatcher
from .explain import builder_difference
from .result import RuleResult
from ..control.shape import decode_len

RULES = {
    "gdn builder": ("v1/attention/backends/gdn_attn.py: GDNAttentionMetadataBuilder.build, "
                    "build_for_cudagraph_capture", "repro/control/builder.py: GDNMetadataBuilder"),
}


def results() -> dict[str, RuleResult]:
    return {r: RuleResult(r, *RULES[r]) for r in RULES}


def _list(t):
    return None if t is None else t.tolist()


class ControlPath:
    """One runner's control path for a case, with both builders (module docstring)."""

    def __init__(self, up, case, rules):
        self.case, self.rules, self.k = case, rules, case.spec_tokens
        cfg = vllm_config(up, case)
        Dispatcher(up, cfg)  # resolves the mode and rounds the sizes before the builder exists, as the runner does
        self.theirs = Builder(up, cfg)
        self.dispatcher = mirror_dispatcher(case, rules)
        sizes = self.dispatcher.sizes
        self.input_batch = InputBatch(max(case.max_num_seqs, max(sizes, default=1)), decode_len(self.k), 0, rules)
        self.ours = GDNMetadataBuilder(self.k, staging_rows(case.max_num_seqs, sizes, self.k), "cpu",
                                       full_graphs=parse_mode(case.mode).has(Runtime.FULL), pad=0, rules=rules)
        self.captured: set = set()
        self.unwritten_reads = 0  # FULL replays reading a buffer row vLLM never wrote

    def _buffers(self) -> dict:
        """Each buffer both keep, as lists, with the entries vLLM never wrote as None on both sides."""
        out = {}
        for theirs, ours in BUFFERS.items():
            if ours is None:
                continue
            v = self.theirs.buffers()[theirs].numpy()
            m = getattr(self.ours, ours).numpy()
            if v.shape != m.shape:
                out[f"buffer {ours} shape"] = (v.shape, m.shape)
                continue
            written = v != POISON
            out[f"buffer {ours}"] = (np.where(written, v, -1).tolist(), np.where(written, m, -1).tolist())
        return out

    def _staged(self, theirs_meta, ours_meta) -> dict:
        out = {}
        for name, flag in self.theirs.staged(theirs_meta).items():
            ours = BUFFERS[name]
            if ours is None:
                continue
            t = getattr(ours_meta, ours, None)
            mine = t is not None and t.untyped_storage().data_ptr() == getattr(self.ours, ours).untyped_storage().data_ptr()
            out[f"staged {ours}"] = (flag, mine)
        return out

    def _compare(self, result: RuleResult, what, common: Common, capture: bool = False) -> None:
        theirs = self.theirs.build_for_capture(common) if capture else self.theirs.build(common)
        ours = self.ours.build_for_capture(common) if capture else self.ours.build(common)
        mine = {f: (_list(getattr(ours, f)) if hasattr(getattr(ours, f), "tolist") else getattr(ours, f))
                for f in fields(theirs)}
        pairs = {f: (v, mine[f]) for f, v in fields(theirs).items()}
        pairs.update(self._staged(theirs, ours))
        pairs.update(self._buffers())
        result.compare(what, pairs, builder_difference(theirs, common))

    def _capture(self, result, desc, step) -> None:
        """`_capture_meta`: the capture build over null block-table rows, the first time a FULL key is used."""
        if desc in self.captured:
            return
        self.captured.add(desc)
        q = np.full(desc.num_reqs, desc.num_tokens // desc.num_reqs, dtype=np.int32)
        blocks = np.zeros((desc.num_reqs, decode_len(self.k)), dtype=np.int32)
        self._compare(result, lambda: f"capture of {desc} (step {step}) under {self.case.label()}",
                      Common(q, q, q > 0, q - 1, q, blocks, desc.num_tokens), capture=True)

    def _check_replay(self, desc) -> None:
        """A FULL replay reads the first `desc.num_reqs` rows of the staged buffers."""
        name = "spec_state_indices_tensor" if self.k else "non_spec_state_indices_tensor"
        rows = self.theirs.buffers()[name][:desc.num_reqs]
        self.unwritten_reads += bool((rows == POISON).any())

    def step(self, b, result: RuleResult) -> None:
        k, rules, ib = self.k, self.rules, self.input_batch
        ib.update(list(zip(b.request_ids, b.block_rows())), b.block_size is not None, set(b.finished))
        if b.dummy:
            runtime, desc = self.dispatcher.dispatch(decode_len(k), True)
        else:
            uniform = uniform_decode(rules.uniform_decode, b.query_lens, prefilling(rules.uniform_decode, b), k)
            runtime, desc = self.dispatcher.dispatch(b.num_tokens, uniform)
        if runtime is Runtime.FULL:
            self._capture(result, desc, b.step)
        label = lambda: f"step {b.step} (query_lens {b.query_lens}, computed {b.computed()}) under {self.case.label()}"
        if b.dummy:
            if runtime is Runtime.FULL:
                if rules.dummy_commits_block_table:
                    ib.commit(desc.num_reqs)
                if rules.dummy_restages:
                    q = np.zeros(desc.num_reqs, dtype=np.int32)
                    q[0] = decode_len(k)
                    self._compare(result, lambda: f"dummy {label()}",
                                  Common(q, q, q > 0, q - 1, q, ib.committed[:desc.num_reqs], desc.num_tokens),
                                  capture=True)
                self._check_replay(desc)
            return
        _, accepted = forward_copies(b)
        ib.commit(ib.num_rows)
        rows = ib.rows(b.request_ids)
        pad_rows = desc.num_reqs - b.num_reqs if runtime is Runtime.FULL else 0
        blocks = np.concatenate((rows, np.zeros((pad_rows, rows.shape[1]), dtype=np.int32)))
        size = desc.num_tokens if runtime is Runtime.FULL else b.num_tokens
        self._compare(result, label, common_for(b, blocks, pad_rows, size, accepted, rules))
        if runtime is Runtime.FULL:
            self._check_replay(desc)


def run(up, pairs, rules) -> tuple[list[RuleResult], int]:
    """`pairs`: (case, sequence) to walk. Returns the results and the FULL replays that read a row
    vLLM's buffers never wrote."""
    out = results()
    unwritten = 0
    for case, seq in pairs:
        try:
            path = ControlPath(up, case, rules)
        except ValueError as e:  # a configuration vLLM refuses at start-up (pydantic's errors are ValueErrors)
            out["gdn builder"].refuse(f"{case.label()}: {type(e).__name__}: {e}")
            continue
        for b in seq.batches():
            path.step(b, out["gdn builder"])
        unwritten += path.unwritten_reads
    return list(out.values()), unwritten


__all__ = ["ControlPath", "run"]
