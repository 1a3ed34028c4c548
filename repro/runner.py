"""Eager and graph runners over one copy of a GDN layer's islands, mirroring vLLM's runner.

Graph runner, both modes (`../shared/DESIGN.md`): capture sizes, pad a batch to the next
size, persistent input buffers addressed by slicing (one max-size buffer for every step,
mixed steps included), graphs captured lazily on the first step that needs a size into one
shared pool, a warm-up run before each capture, outputs of the last piece held by weak
reference (vLLM's `weak_ref_output`), the splitting op `gdn_core` eager between pieces in
`piecewise`, and the whole decode chain as one graph in `full` (mixed steps run eagerly, as
FULL_DECODE_ONLY does). Hazards and repairs change exactly one mechanism each
(`hazards.py` describes them).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from .batch import StepBatch
from .graphs.lint import Lint
from .config import ModelConfig
from .islands.gdn import CanaryHead, GDNCore, GDNMeta, StateCache, Submod0, Submod1
from .islands.moe import MoEBlock
from .weights import HeadWeights, LayerWeights

DEFAULT_SIZES = (1, 2, 4, 8, 16)
# Hazards that describe what a compiler does to a captured piece, not the model's code: only
# the replay copy gets them (the eager copy is the reference).
REPLAY_ONLY = {"output-alias"}


def pad_size(n: int, sizes) -> int | None:
    for s in sorted(sizes):
        if s >= n:
            return s
    return None


class LayerCopy:
    """One copy (eager or replay) of submod0 -> gdn_core -> submod1 -> canary head, with its
    own state cache."""

    def __init__(self, cfg: ModelConfig, layer: LayerWeights, head: HeadWeights, next_norm: torch.Tensor,
                 num_slots: int, device, sentinel: int = 0, hazards=frozenset(), tp_size: int = 1):
        self.cfg, self.device = cfg, torch.device(device)
        self.cache = StateCache(cfg, num_slots, device, tp_size=tp_size, sentinel=sentinel)
        self.submod0 = Submod0(cfg, layer, head, tp_size)
        self.gdn_core = GDNCore(cfg, layer, self.cache, tp_size)
        self.moe = MoEBlock(cfg, layer)
        self.submod1 = Submod1(cfg, layer, next_norm, self.moe, tp_size)
        self.head = CanaryHead(cfg, head)
        self.ctx = self.submod0.ctx
        for isl in self.islands():
            isl.hazards = frozenset(hazards)
            isl.ctx = self.ctx

    def islands(self):
        return (self.submod0, self.gdn_core, self.submod1, self.head)

    def set_context(self, num_tokens: int | None) -> None:
        self.ctx.set(num_actual_tokens=num_tokens)


def _ids(batch: StepBatch, device) -> torch.Tensor:
    return torch.tensor(batch.token_ids, dtype=torch.long, device=device)


class EagerRunner:
    """The reference: every island eager, exact shapes, no padding."""

    def __init__(self, copy: LayerCopy):
        self.copy = copy

    def step(self, batch: StepBatch) -> dict[str, torch.Tensor]:
        c = self.copy
        c.set_context(batch.num_tokens)
        with torch.inference_mode():
            o0 = c.submod0(input_ids=_ids(batch, c.device))
            core = c.gdn_core(qkv=o0["qkv"], b=o0["b"], a=o0["a"], core_out=o0["core_out"],
                              meta=batch.meta(c.device))["core_out"]
            o1 = c.submod1(core_out=core, z=o0["z"], residual=o0["residual"])
            ids = c.head(hidden=o1["hidden"])["token_ids"]
        return _collect(o0, o1, ids, batch.num_tokens, core)


def _collect(o0, o1, ids, n, core=None) -> dict[str, torch.Tensor]:
    """Every island's outputs, live rows only, as the step left them. `core` is what the
    splitting op returned (its `core_out` buffer unless it allocated a fresh tensor)."""
    out = {f"submod0.{k}": v[:n] for k, v in o0.items() if k != "core_out"}
    out["gdn_core.core_out"] = (o0["core_out"] if core is None else core)[:n]
    out.update({f"submod1.{k}": v[:n] for k, v in o1.items()})
    out["head.token_ids"] = ids[:n]
    return {k: v.clone() for k, v in out.items()}


@dataclass
class Finding:
    kind: str  # "python-state", "undeclared-mutation", "alias", "stream"
    island: str
    detail: str

    def to_json(self):
        return {"kind": self.kind, "island": self.island, "detail": self.detail}


@dataclass
class _Captured:
    size: int
    graphs: list = field(default_factory=list)
    outs: list = field(default_factory=list)  # per piece: dict of outputs (maybe weak aliases)
    ins1: dict | None = None  # submod1's static inputs when submod0 runs eagerly
    owned0: dict | None = None  # clone-outputs: runner-owned copies of graph 0's outputs
    watched: dict = field(default_factory=dict)  # python attributes at capture
    frozen: dict = field(default_factory=dict)  # forward-context values read during capture
    step: int = 0


class GraphRunner:
    def __init__(self, copy: LayerCopy, provider, mode: str = "piecewise", sizes=DEFAULT_SIZES,
                 hazards=frozenset(), repairs=frozenset(), max_tokens: int = 64, stream=None):
        self.copy, self.provider, self.mode = copy, provider, mode
        self.sizes, self.hazards, self.repairs = tuple(sorted(sizes)), frozenset(hazards), frozenset(repairs)
        self.sentinel = copy.cache.sentinel
        dev = copy.device
        n = max(max_tokens, max(self.sizes))
        # Persistent buffers, sliced per step (vLLM's input_ids / state-index buffers).
        self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.token_slot = torch.full((n,), self.sentinel, dtype=torch.int32, device=dev)
        self.pool = provider.new_pool("shared")
        self.captured: dict[int, _Captured] = {}
        self.findings: list[Finding] = []
        self.replays = 0
        self.captures = 0
        self.stream = stream
        self.eager_family = {r.split("=", 1)[1] for r in self.repairs if r.startswith("eager-family=")}
        self._host = None
        self._noted: set = set()
        self._side = None  # side stream of the side-stream-no-wait hazard
        self._core_linted: set = set()  # splitting-op call kinds (decode?, prefill?) linted once
        for isl in copy.islands():
            isl.escape = provider.escape
        if provider.name == "cuda":
            # work on a stream the capture does not follow is only legal in relaxed capture mode
            relaxed = "escaped-capture" in self.hazards
            provider.capture_kwargs = {"capture_error_mode": "relaxed"} if relaxed else {}

    # ---- static buffers -------------------------------------------------------------------
    def _pad_value(self) -> int:
        if "pad-sentinel-mismatch" in self.hazards and "sanitize-pad" not in self.repairs:
            return 0 if self.sentinel != 0 else -1
        return self.sentinel

    def _fill(self, batch: StepBatch, size: int) -> None:
        n = batch.num_tokens
        self.input_ids[:n].copy_(_ids(batch, self.copy.device))
        slots = torch.tensor(batch.token_slots(), dtype=torch.int32, device=self.copy.device)
        self.token_slot[:n].copy_(slots)
        stale = "stale-pad" in self.hazards and "sanitize-pad" not in self.repairs
        mismatch = "pad-sentinel-mismatch" in self.hazards
        if size > n and (not stale or mismatch):
            # nano-vllm's `slot_mapping.fill_(-1)`: padded rows carry the kernel's sentinel.
            self.input_ids[n:size].zero_()
            self.token_slot[n:size].fill_(self._pad_value())

    # ---- capture --------------------------------------------------------------------------
    def _graphable(self, batch: StepBatch) -> int | None:
        size = pad_size(batch.num_tokens, self.sizes)
        if size is None:
            return None
        if self.mode == "full" and not batch.uniform_decode:
            return None
        return size

    def _full_chain(self, size: int):
        c = self.copy
        ids = self.input_ids[:size]
        meta = GDNMeta(query_start_loc=torch.arange(size + 1, dtype=torch.int32, device=c.device),
                       state_indices=self.token_slot[:size], has_initial_state=None,
                       num_decodes=size, num_tokens=size)

        def chain():
            o0 = c.submod0(input_ids=ids)
            c.gdn_core(qkv=o0["qkv"], b=o0["b"], a=o0["a"], core_out=o0["core_out"], meta=meta)
            o1 = c.submod1(core_out=o0["core_out"], z=o0["z"], residual=o0["residual"])
            return {**o0, **o1}
        return chain

    @contextlib.contextmanager
    def _protect_state(self):
        """Warm-up and capture run the ops on the tape (and warm-up everywhere): keep the state
        caches as they were, as a capture on dummy slots would."""
        saved = {k: v.clone() for k, v in self.copy.gdn_core.state().items()}
        try:
            yield
        finally:
            for k, v in self.copy.gdn_core.state().items():
                v.copy_(saved[k])

    def _watch(self):
        return {isl.name: isl.watched() for isl in self.copy.islands()}

    def _capture(self, size: int, batch: StepBatch) -> _Captured:
        c = self.copy
        cap = _Captured(size, step=batch.step)
        before = self._watch()
        c.ctx.reads.clear()
        self.captures += 1
        with torch.inference_mode():
            if self.mode == "full":
                self._capture_full(cap)
            else:
                self._capture_piecewise(cap)
        after = self._watch()
        for name in before:
            for k, v in after[name].items():
                if before[name].get(k, v) != v:
                    self._note("python-state", name, f"{name}.{k} was {before[name].get(k)!r}, set to {v!r} "
                               f"during capture of size {size}: the graph freezes it")
        cap.watched = after
        if self.mode == "piecewise":
            self._alias_map(cap)
        ctx = c.ctx.values()
        cap.frozen = {k: ctx.get(k) for k in c.ctx.reads}
        return cap

    def _capture_full(self, cap: _Captured) -> None:
        chain = self._full_chain(cap.size)
        with self._protect_state():
            self._linted(chain)  # warm-up
            g, out = self.provider.capture(chain, self.pool, self.stream)
        cap.graphs, cap.outs = [g], [self._hold_last(g, out)]

    def _capture_piecewise(self, cap: _Captured) -> None:
        c = self.copy
        ids = self.input_ids[:cap.size]
        g0 = o0 = None
        if "submod0" not in self.eager_family:
            self._linted(lambda: c.submod0(input_ids=ids))  # warm-up
            g0, o0 = self.provider.capture(lambda: c.submod0(input_ids=ids), self.pool, self.stream)
            o0 = self._hold_first(g0, o0)
        cap.graphs.append(g0)
        cap.outs.append(o0)
        if o0 is None:
            o0 = c.submod0(input_ids=ids)
        clone = "clone-outputs" in self.repairs and g0 is not None
        if clone:
            # Runner-owned copies of graph 0's outputs, outside the pool, filled after each
            # replay: whoever holds graph 0's outputs holds these, not pool memory.
            cap.owned0 = {k: v.clone() for k, v in o0.items() if k != "core_out"}
        ins = {k: o0[k] for k in Submod1.inputs}
        if g0 is None or clone:
            # graph 1 reads runner-owned buffers filled each step: out of the pool, and apart
            # from what holders of graph 0's outputs see
            ins = {k: v.clone() for k, v in ins.items()}
            cap.ins1 = ins
        if "submod1" in self.eager_family or "moe" in self.eager_family:
            cap.graphs.append(None)
            cap.outs.append(None)
            cap.ins1 = ins
            return
        pool1 = self.provider.new_pool("private") if "private-pool" in self.repairs else self.pool
        self._linted(lambda: c.submod1(**ins))  # warm-up
        g1, o1 = self.provider.capture(lambda: c.submod1(**ins), pool1, self.stream)
        cap.graphs.append(g1)
        cap.outs.append(self._hold_last(g1, o1))

    def _alias_map(self, cap: _Captured) -> None:
        """Graph 0's outputs are held until the end of the step (the splitting op and the caller
        read them); report bytes of them that graph 1's replay writes."""
        g0, g1 = cap.graphs
        o0, o1 = cap.outs
        if g0 is None or o0 is None:
            return
        held = {k: _span(v) for k, v in o0.items()}
        writes = list(self.provider.written_spans(g1)) if g1 is not None else []
        writes += [_span(v) for v in (o1 or {}).values()]
        for k, (a, b) in held.items():
            if any(a < y and x < b for x, y in writes):
                self._note("alias", "submod1", f"size {cap.size}: graph 1's replay writes bytes that hold graph 0's "
                           f"output `{k}`, which the splitting op and the caller still read")

    def _linted(self, fn):
        lint = Lint("the piece", self.copy.gdn_core.state())
        with lint:
            out = fn()
        for kind, detail in lint.problems:
            self._note(kind, "lint", detail)
        return out

    def _note(self, kind, island, detail):
        if (kind, detail) not in self._noted:
            self._noted.add((kind, detail))
            self.findings.append(Finding(kind, island, detail))

    def _hold_first(self, g, out):
        """Graph 0's outputs feed graph 1. vLLM holds them strongly; the `shared-pool-weakref`
        hazard weak-refs them too, so the next capture may put its tensors over them."""
        if "shared-pool-weakref" in self.hazards and "private-pool" not in self.repairs:
            return self._weaken(g, out)
        self.provider.release_all_but(g, list(out.values()))
        return out

    def _hold_last(self, g, out):
        """The last piece's outputs are weak references (vLLM), read before the next replay."""
        return self._weaken(g, out)

    def _weaken(self, g, out):
        weak = getattr(self.provider, "weak_alias", None)
        if weak is None:  # tape: the tensors stay, their blocks go back to the pool
            self.provider.release_all_but(g, [])
            return out
        aliased = {k: weak(v) for k, v in out.items()}
        if any(v is None for v in aliased.values()):
            return out  # no weak tensors on this device: keep strong references
        return aliased

    # ---- step -----------------------------------------------------------------------------
    def step(self, batch: StepBatch) -> dict[str, torch.Tensor]:
        c = self.copy
        size = self._graphable(batch)
        self._fill(batch, size or batch.num_tokens)
        c.set_context(batch.num_tokens)
        if size is None:
            return self._eager_step(batch)
        cap = self.captured.get(size)
        if cap is not None and cap.frozen:
            now = c.ctx.values()
            changed = {k: (v, now.get(k)) for k, v in cap.frozen.items() if now.get(k) != v}
            if changed:
                self._note_frozen(size, changed)
                if "recapture" in self.repairs:
                    cap = None
        if cap is None:
            cap = self.captured[size] = self._capture(size, batch)
        n = batch.num_tokens
        with torch.inference_mode():
            if self.mode == "full":
                self._replay(cap.graphs[0])
                o = cap.outs[0]
                o0 = {k: o[k] for k in Submod0.outputs}
                o1 = {k: o[k] for k in Submod1.outputs}
            else:
                o0 = self._run_piece(cap, 0, lambda: c.submod0(input_ids=self.input_ids[:size]))
                held = o0
                if cap.owned0 is not None:
                    for k, v in cap.owned0.items():
                        v.copy_(o0[k])
                    held = {**o0, **cap.owned0}
                meta = batch.meta(c.device)
                core = lambda: c.gdn_core(qkv=o0["qkv"][:n], b=o0["b"][:n], a=o0["a"][:n],  # noqa: E731
                                          core_out=o0["core_out"][:n], meta=meta)
                kind = (batch.num_decodes > 0, batch.num_tokens > batch.num_decodes)
                r = core() if kind in self._core_linted else self._linted(core)
                self._core_linted.add(kind)
                fresh = r["core_out"]
                if fresh.data_ptr() != o0["core_out"].data_ptr():
                    self._note("alias", "gdn_core", "gdn_core returned a fresh tensor, not the core_out buffer graph 1 "
                               "captured: without copy-inputs graph 1 reads the stale buffer")
                    if "copy-inputs" in self.repairs:
                        o0["core_out"][:n].copy_(fresh)
                ins = cap.ins1
                if ins is not None:  # submod1 reads runner-owned buffers: fill them
                    for k in ins:
                        if ins[k].data_ptr() != o0[k].data_ptr():
                            ins[k].copy_(o0[k])
                o1 = self._run_piece(cap, 1, lambda: c.submod1(core_out=fresh, z=o0["z"][:n], residual=o0["residual"][:n]))
                if cap.owned0 is not None:
                    fresh = ins["core_out"][:n]  # the holder's copy, out of the pool
            o1 = self._consume(o1)
            ids = c.head(hidden=o1["hidden"][:n])["token_ids"]
        return _collect(o0 if self.mode == "full" else held, o1, ids, n, None if self.mode == "full" else fresh)

    def _note_frozen(self, size, changed):
        for k, (was, now) in changed.items():
            self._note("python-state", "forward-context",
                       f"{k} was {was!r} when size {size} was captured and differs at a later replay: "
                       "forward read it during capture, so replay uses the frozen value")

    def _run_piece(self, cap, i, eager):
        g = cap.graphs[i]
        if g is None:
            return eager()
        self._replay(g)
        return cap.outs[i]

    def _replay(self, g):
        self.replays += 1
        if "side-stream-no-wait" not in self.hazards:
            g.replay()
            return
        p = self.provider
        main = p.current_stream()
        if self._side is None:
            self._side = p.new_stream()
        self._side.wait_stream(main)  # inputs were written on the main stream
        with p.stream(self._side):
            if p.device.type == "cuda":
                # a long kernel already queued on the side stream makes the race deterministic
                torch.cuda._sleep(20_000_000)
            g.replay()
        if "event-wait" in self.repairs:
            ev = p.new_event()
            ev.record(self._side)
            main.wait_event(ev)
        else:
            self._note("stream", "runner", "graphs replay on a side stream and their outputs are read on the main "
                       "stream with no event between them")

    def _consume(self, out):
        """How the host reads the last piece's outputs (stream hazards live here)."""
        p = self.provider
        if "async-output-copy" in self.hazards:
            if self._host is None:
                self._host = {}
            host = {}
            for k, v in out.items():
                key = (k, tuple(v.shape))
                if key not in self._host:  # one pinned buffer per output and size, reused
                    self._host[key] = torch.empty(v.shape, dtype=v.dtype, pin_memory=True)
                host[k] = self._host[key]
                host[k].copy_(v, non_blocking=True)
            if "sync-output-copy" in self.repairs:
                p.synchronize()
            # the host reads the pinned buffer now (a CPU clone is not ordered after the copy)
            return {k: v.clone().to(out[k].device) for k, v in host.items()}
        return out

    def _eager_step(self, batch: StepBatch):
        c = self.copy
        n = batch.num_tokens
        with torch.inference_mode():
            o0 = c.submod0(input_ids=self.input_ids[:n])
            core = c.gdn_core(qkv=o0["qkv"], b=o0["b"], a=o0["a"], core_out=o0["core_out"],
                              meta=batch.meta(c.device))["core_out"]
            o1 = c.submod1(core_out=core, z=o0["z"], residual=o0["residual"])
            ids = c.head(hidden=o1["hidden"])["token_ids"]
        return _collect(o0, o1, ids, n, core)


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + max(t.numel(), 1) * t.element_size()


class PieceRunner:
    """One island as one graph per padded size (the `moe` island): static `input_ids`, lazy
    capture into the shared pool, output read before the next replay."""

    def __init__(self, island, provider, sizes=DEFAULT_SIZES, max_tokens: int = 64):
        self.island, self.provider, self.sizes = island, provider, tuple(sorted(sizes))
        dev = provider.device
        self.input_ids = torch.zeros(max(max_tokens, max(self.sizes)), dtype=torch.long, device=dev)
        self.pool = provider.new_pool("shared")
        self.graphs: dict[int, tuple] = {}
        self.replays = self.captures = 0
        self.findings: list[Finding] = []

    def step(self, token_ids: list[int]) -> dict[str, torch.Tensor]:
        n = len(token_ids)
        size = pad_size(n, self.sizes)
        self.input_ids[:n].copy_(torch.tensor(token_ids, dtype=torch.long))
        with torch.inference_mode():
            if size is None:
                out = self.island(input_ids=self.input_ids[:n])
            else:
                self.input_ids[n:size].zero_()
                if size not in self.graphs:
                    ids = self.input_ids[:size]
                    self.island(input_ids=ids)  # warm-up
                    g, o = self.provider.capture(lambda: self.island(input_ids=ids), self.pool)
                    self.provider.release_all_but(g, list(o.values()))
                    self.graphs[size] = (g, o)
                    self.captures += 1
                g, out = self.graphs[size]
                g.replay()
                self.replays += 1
        return {f"{self.island.name}.{k}": v[:n].clone() for k, v in out.items()}
