"""Lockstep eager vs replay, and the first-divergence microscope.

The same steps run through an eager copy and a replay copy of the islands, each with its own
state caches. After every step every island output (live rows), the state rows of live and
touched slots, and the canary token ids are compared bit for bit. The first difference is
reported with its step, island, tensor, row (request and slot) and max abs difference, plus
digests of what went in at that step and the step before.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

import torch

from .batch import StepBatch
from .capture import DEFAULT_SIZES
from .islands.layer import LayerCopy
from .options import Options
from .runner import EagerRunner, GraphRunner, PieceRunner


def digest(t) -> str:
    if isinstance(t, torch.Tensor):
        t = t.detach().contiguous().cpu()
        b = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return hashlib.sha1(b + str(t.dtype).encode() + str(tuple(t.shape)).encode()).hexdigest()[:12]
    return hashlib.sha1(json.dumps(t, sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class Divergence:
    step: int
    island: str
    tensor: str
    row: int | None
    request: int | None
    slot: int | None
    max_abs: float
    context: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"step": self.step, "island": self.island, "tensor": self.tensor, "row": self.row,
                "request": self.request, "slot": self.slot, "max_abs": self.max_abs, "context": self.context}

    def line(self) -> str:
        where = f"row {self.row}" if self.row is not None else ""
        who = f" (request {self.request}, slot {self.slot})" if self.request is not None or self.slot is not None else ""
        return f"step {self.step}: {self.island}.{self.tensor} {where}{who} max|diff| {self.max_abs:.3g}"


def _max_abs(a, b) -> float:
    if a.dtype == torch.bool or not (a.is_floating_point() or b.is_floating_point()):
        return float((a.long() - b.long()).abs().max()) if a.numel() else 0.0
    d = (a.float() - b.float()).abs()
    d = torch.nan_to_num(d, nan=float("inf"))
    return float(d.max()) if d.numel() else 0.0


def _first_row(a, b) -> int:
    same = (a == b) | (torch.isnan(a.float()) & torch.isnan(b.float())) if a.is_floating_point() else (a == b)
    bad = ~same.reshape(same.shape[0], -1).all(-1) if same.dim() else ~same.reshape(1)
    return int(bad.int().argmax())


def _row_owner(batch: StepBatch, row: int):
    """(request, slot) owning token row `row` of a step."""
    acc = 0
    for rid, slot, q in zip(batch.request_ids, batch.slots, batch.query_lens):
        if row < acc + q:
            return rid, slot
        acc += q
    return None, None


def _step_context(batch: StepBatch | None, runner: GraphRunner | None) -> dict:
    if batch is None:
        return {}
    ctx = {"step": batch.step, "requests": batch.request_ids, "slots": batch.slots,
           "query_lens": batch.query_lens, "has_initial_state": batch.has_initial_state,
           "token_ids": digest(batch.token_ids)}
    if runner is not None:
        n = batch.num_tokens
        size = next((s for s in runner.sizes if s >= n), None)
        ctx["padded_to"] = size
        if size:
            ctx["pad_state_indices"] = runner.token_slot[n:size].tolist()
            ctx["pad_input_ids"] = runner.input_ids[n:size].tolist()
    return ctx


def compare_step(batch: StepBatch, eager_out, replay_out, eager: LayerCopy, replay: LayerCopy) -> Divergence | None:
    order = sorted(eager_out, key=lambda k: ("submod0", "gdn_core", "submod1", "head").index(k.split(".")[0]))
    for key in order:
        a, b = eager_out[key], replay_out[key]
        if not torch.equal(a, b):
            row = _first_row(a, b)
            rid, slot = _row_owner(batch, row)
            isl, name = key.split(".", 1)
            return Divergence(batch.step, isl, name, row, rid, slot, _max_abs(a, b))
    slots = sorted(set(batch.slots) | set(batch.live_slots))
    for name, ta in eager.cache.tensors().items():
        tb = replay.cache.tensors()[name]
        for slot in slots:
            if not torch.equal(ta[slot], tb[slot]):
                rid = next((r for r, s in zip(batch.request_ids, batch.slots) if s == slot), None)
                return Divergence(batch.step, "gdn_core", name, None, rid, slot, _max_abs(ta[slot], tb[slot]))
    return None


@dataclass
class LockstepResult:
    steps: int
    divergence: Divergence | None
    findings: list
    eager_us: float
    replay_us: float
    replays: int
    captures: int

    @property
    def diverged(self) -> bool:
        return self.divergence is not None


class Lockstep:
    """An eager copy and a replay copy of the islands stepping together. `make_copy(island_opts)`
    builds one copy with its own state cache; `opts` (`hazards.options_for`) says what the case's
    knobs change in each copy and in the runner."""

    def __init__(self, make_copy, provider, mode="piecewise", opts: Options = Options(), sizes=None,
                 max_tokens=64, trace=None):
        self.provider, self.trace = provider, trace
        self.eager_copy = make_copy(opts.eager_island)
        self.replay_copy = make_copy(opts.replay_island)
        self.eager = EagerRunner(self.eager_copy)
        self.graph = GraphRunner(self.replay_copy, provider, mode=mode, sizes=sizes or DEFAULT_SIZES,
                                 opts=opts.runner, max_tokens=max_tokens)
        self.t_eager = self.t_replay = 0.0
        self.steps = 0
        self.prev: StepBatch | None = None

    def step(self, batch: StepBatch) -> Divergence | None:
        t0 = time.perf_counter()
        e = self.eager.step(batch)
        t1 = time.perf_counter()
        r = self.graph.step(batch)
        self.provider.synchronize()
        t2 = time.perf_counter()
        self.t_eager += t1 - t0
        self.t_replay += t2 - t1
        self.steps += 1
        div = compare_step(batch, e, r, self.eager_copy, self.replay_copy)
        if self.trace is not None:
            self.trace.write(json.dumps({"step": batch.step, "eager": {k: digest(v) for k, v in e.items()},
                                         "replay": {k: digest(v) for k, v in r.items()}}) + "\n")
        if div is not None:
            div.context = {"this_step": _step_context(batch, self.graph),
                           "previous_step": _step_context(self.prev, None),
                           "eager_digest": {k: digest(v) for k, v in e.items()},
                           "replay_digest": {k: digest(v) for k, v in r.items()}}
        self.prev = batch
        return div

    def result(self, div: Divergence | None) -> LockstepResult:
        n = max(self.steps, 1)
        return LockstepResult(self.steps, div, list(self.graph.findings), self.t_eager / n * 1e6,
                              self.t_replay / n * 1e6, self.graph.replays, self.graph.captures)


def run_lockstep(make_copy, provider, batches: list[StepBatch], mode="piecewise", opts: Options = Options(),
                 sizes=None, trace=None, progress=None, max_tokens=64) -> LockstepResult:
    ls = Lockstep(make_copy, provider, mode, opts, sizes,
                  max(max_tokens, max((b.num_tokens for b in batches), default=1)), trace)
    div = None
    for i, batch in enumerate(batches):
        div = ls.step(batch)
        if progress:
            progress(i + 1, len(batches))
        if div is not None:
            break
    return ls.result(div)


def run_moe_lockstep(model, provider, batches, sizes=None, progress=None) -> LockstepResult:
    """The `moe` island alone: eager vs one graph per size, fed each step's token rows."""
    from .islands.moe import MoEIsland

    eager = MoEIsland(model.cfg, model.weights, model.head)
    runner = PieceRunner(MoEIsland(model.cfg, model.weights, model.head), provider, sizes or DEFAULT_SIZES,
                         max_tokens=max((b.num_tokens for b in batches), default=1))
    t_e = t_r = 0.0
    for i, batch in enumerate(batches):
        t0 = time.perf_counter()
        with torch.inference_mode():
            e = {f"moe.{k}": v.clone() for k, v in eager(input_ids=torch.tensor(batch.token_ids, device=provider.device)).items()}
        t1 = time.perf_counter()
        r = runner.step(batch.token_ids)
        provider.synchronize()
        t2 = time.perf_counter()
        t_e += t1 - t0
        t_r += t2 - t1
        for key in e:
            if not torch.equal(e[key], r[key]):
                row = _first_row(e[key], r[key])
                rid, slot = _row_owner(batch, row)
                div = Divergence(batch.step, "moe", key.split(".", 1)[1], row, rid, slot, _max_abs(e[key], r[key]),
                                 {"this_step": _step_context(batch, None)})
                n = i + 1
                return LockstepResult(n, div, [], t_e / n * 1e6, t_r / n * 1e6, runner.replays, runner.captures)
        if progress:
            progress(i + 1, len(batches))
    n = max(len(batches), 1)
    return LockstepResult(len(batches), None, [], t_e / n * 1e6, t_r / n * 1e6, runner.replays, runner.captures)
