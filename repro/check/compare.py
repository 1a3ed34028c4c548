"""NaN-aware comparison of two copies' tensors, and the `Divergence` record it produces.

Two tensors are *the same* when every element is bit-for-bit equal, where an element that is
NaN in both copies counts as equal (as does the same infinity in both: `inf == inf` already).
A NaN or inf in one copy only is never folded into a number: |d| is taken over the elements that
are finite in both copies, and the one-sided non-finite values are reported as such
(`Divergence.nonfinite` names the copy that holds them).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field

import torch

# Classes of a difference between eager and replay (`oracle.py` decides which).
GRAPH_HAZARD = "graph hazard"  # replay differs from an eager run of the same padded shape: a failure
CORRUPTION = "corruption"  # beyond the calibrated bound, one-sided non-finite, or a changed canary: a failure
BATCH_VARIANCE = "batch variance"  # exact-shape eager vs padded-shape eager, within the bound: a finding
NONDETERMINISM = "nondeterminism"  # the same eager call on identical inputs differs: a finding
ROUTING_TIE = "routing tie"  # the MoE router flipped an expert at a near-tie vs the reference copy: a finding
FAILURES = (GRAPH_HAZARD, CORRUPTION)
WEIGHTS = "weights"  # the `island` of a weight that changed
UNOWNED = "no live request owns it"  # the note of a state slot written outside every live request
KERNEL_FINDINGS = (BATCH_VARIANCE, NONDETERMINISM, ROUTING_TIE)


def digest(t) -> str:
    if isinstance(t, torch.Tensor):
        t = t.detach().contiguous().cpu()
        b = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return hashlib.sha1(b + str(t.dtype).encode() + str(tuple(t.shape)).encode()).hexdigest()[:12]
    return hashlib.sha1(json.dumps(t, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Divergence:
    """Where two copies first differ, and (once classified) what kind of difference it is. Frozen:
    compare makes it, the oracle classifies it and the lockstep annotates it, each with `replace`."""

    step: int
    island: str
    tensor: str
    row: int | None
    request: int | None
    slot: int | None
    max_abs: float  # over elements finite in both copies (0.0 if the only difference is non-finite)
    context: dict = field(default_factory=dict)
    kind: str | None = None  # one of the classes above; None until `oracle.classify` has run
    nonfinite: str | None = None  # "eager" / "replay" / "both": which copy holds one-sided NaN or inf
    reason: str = ""  # why this class (the evidence the oracle used)
    bound: float | None = None  # the calibrated bound the difference was held against
    rank: int | None = None  # a multi-rank run: the rank that saw it (`context` holds its step index)
    note: str = ""  # e.g. "no live request owns it" (a state slot), "changed in place" (a weight)
    kernel: object = None  # a kernel finding: the `kernelcase.KernelCase` that shows it alone
    departed: str | None = None  # "replay" / "eager" / "both": beyond the independent reference copy's bound
    damage: dict | None = None  # where the run stopped: the state blocks the copies hold apart (`Lockstep.damage`)

    @property
    def failure(self) -> bool:
        """A graph hazard or corruption (or not yet classified): fails a clean case."""
        return self.kind not in KERNEL_FINDINGS

    def to_json(self) -> dict:
        return {"step": self.step, "island": self.island, "tensor": self.tensor, "row": self.row,
                "request": self.request, "slot": self.slot, "max_abs": self.max_abs, "kind": self.kind,
                "nonfinite": self.nonfinite, "reason": self.reason, "bound": self.bound, "note": self.note,
                "context": self.context, "kernel": self.kernel.to_json() if self.kernel is not None else None,
                "departed": self.departed, "damage": self.damage}

    def where(self) -> str:
        """The table's cell: step, tensor, row, slot, then |d| or the non-finite copy (and the note)."""
        if self.island == WEIGHTS:
            return f"step {self.step} {self.island}.{self.tensor} {self.note}"
        what = (f"non-finite in {self.nonfinite} only" if self.nonfinite in ("eager", "replay")
                else "non-finite values differ" if self.nonfinite else f"|d|={self.max_abs:.3g}")
        note = f" ({self._tags()})" if self._tags() else ""
        row = f" row {self.row}" if self.row is not None else ""  # a state slot has no token row
        slot = f" slot {self.slot}" if self.slot is not None else ""
        return f"step {self.step} {self.island}.{self.tensor}{row}{slot} {what}{note}"

    def line(self) -> str:
        where = f"row {self.row}" if self.row is not None else ""
        who = f" (request {self.request}, slot {self.slot})" if self.request is not None or self.slot is not None else ""
        what = (f"non-finite in {self.nonfinite} only" if self.nonfinite in ("eager", "replay")
                else "non-finite values differ" if self.nonfinite else f"max|diff| {self.max_abs:.3g}")
        kind = f" [{self.kind}]" if self.kind else ""
        if self.island == WEIGHTS:
            return f"step {self.step}: {self.island}.{self.tensor} {self.note}{kind}"
        note = f" ({self._tags()})" if self._tags() else ""
        return f"step {self.step}: {self.island}.{self.tensor} {where}{who} {what}{note}{kind}"

    def _tags(self) -> str:
        tags = [self.note] if self.note else []
        if self.departed:
            tags.append(f"{self.departed} departed")
        return "; ".join(tags)


def same_mask(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: equal, or NaN in both copies."""
    eq = a == b
    if a.is_floating_point() or b.is_floating_point():
        eq = eq | (torch.isnan(a) & torch.isnan(b))
    return eq


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equal up to NaN in the same places in both copies (shapes and dtypes must match)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if torch.equal(a, b):
        return True
    return bool(same_mask(a, b).all())


def nonfinite_side(a: torch.Tensor, b: torch.Tensor, names=("eager", "replay")) -> str | None:
    """Which copy holds a non-finite value the other does not have in the same place: the first
    name, the second, "both" (each has some, or NaN facing inf), or None."""
    if not (a.is_floating_point() and b.is_floating_point()):
        return None
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    only_a = bool((~fa & fb).any())
    only_b = bool((fa & ~fb).any())
    both_differ = bool((~fa & ~fb & ~same_mask(a, b)).any())
    if both_differ or (only_a and only_b):
        return "both"
    return names[0] if only_a else names[1] if only_b else None


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over the elements finite in both copies (integers: exact difference)."""
    if a.numel() == 0:
        return 0.0
    if a.dtype == torch.bool or not (a.is_floating_point() or b.is_floating_point()):
        return float((a.long() - b.long()).abs().max())
    both = torch.isfinite(a) & torch.isfinite(b)
    d = (a.float() - b.float()).abs()
    d = torch.where(both, d, torch.zeros_like(d))
    return float(d.max())


def magnitude(a: torch.Tensor) -> float:
    """max |a| over its finite elements (0.0 if none)."""
    if a.numel() == 0 or not a.is_floating_point():
        return 0.0
    f = a.float().abs()
    f = torch.where(torch.isfinite(f), f, torch.zeros_like(f))
    return float(f.max())


@dataclass
class Summary:
    """One pair's `same`, and for a float pair that is not, `nonfinite_side`'s three flags,
    `max_abs` and `magnitude` of the first tensor (`summaries`)."""
    same: bool
    floating: bool = False  # the fields below are filled (a float pair of one shape and dtype, not same)
    only_a: bool = False
    only_b: bool = False
    both_differ: bool = False
    max_abs: float = 0.0
    magnitude: float = 0.0

    def side(self, names=("eager", "replay")) -> str | None:
        """`nonfinite_side(a, b, names)`."""
        if self.both_differ or (self.only_a and self.only_b):
            return "both"
        return names[0] if self.only_a else names[1] if self.only_b else None


# Float dtypes whose values fp32 holds exactly, finite ones finite: a pair of them is summarised by
# the whole-list (`torch._foreach_*`) statistics of `summaries`.
WIDENED = (torch.float32, torch.bfloat16, torch.float16)


def summaries(pairs: dict, stacked: bool | None = None) -> dict:
    """{key: Summary} of {key: (a, b)}: what `same`, `nonfinite_side`, `max_abs` and `magnitude(a)`
    say, read from the device in one transfer where they read once each. A pair of two shapes or
    dtypes is not `same`; an integer pair that is not gets `floating` False (its caller uses the
    functions: a failure's path, not the hot one).

    `stacked` (default: off the CPU): the fp32/bf16/fp16 pairs (`WIDENED`, in fp32) go through four
    whole-list statistics, one launch each for every pair together (`torch._foreach_norm`, `_sub`):
    the sums of |a| and of |b|, max|a| and max|a - b|. Where both sums are finite every element is
    (a sum meets any NaN or inf it adds; a finite sum that overflows only sends the pair to the
    second read), and then the pair is `same` exactly when max|a - b| is 0 (IEEE subtraction of two
    finite values is 0 only when they are equal: +0.0 and -0.0 are, as `same` says; subnormals are
    not flushed by these kernels, the test holds it), no side holds a non-finite value, `max_abs`
    is max|a - b| and `magnitude` max|a| (a maximum does not depend on the reduction's order). The
    other pairs (a non-finite value somewhere, fp64, integers) are read as the functions read
    them, in the same transfer for `same`, then in a second for the float pairs that are not.
    Else (the CPU: nothing to transfer, and `torch.equal` stops early) `same` pair by pair."""
    keys = [k for k, (a, b) in pairs.items() if a.shape == b.shape and a.dtype == b.dtype]
    out = {k: Summary(False) for k in pairs}
    if not keys:
        return out
    if stacked is None:
        stacked = pairs[keys[0]][0].device.type != "cpu"
    if stacked:
        rest, eq = _stacked_read(pairs, keys, out)
    else:
        rest, eq = keys, [same(*pairs[k]) for k in keys]
    floats = []
    for k, e in zip(rest, eq):
        out[k] = Summary(bool(e))
        if not e and pairs[k][0].is_floating_point():
            floats.append(k)
    if floats:
        out.update(_float_read(pairs, floats))
    return out


def _stacked_read(pairs: dict, keys: list, out: dict) -> tuple[list, list]:
    """The first transfer of `summaries(stacked=True)`: the four statistics of the `WIDENED` pairs
    (their Summary put in `out` where both sums are finite) and `same` of the other pairs. Returns the
    keys still to read and what `same` said of each (None: not known, read with the statistics)."""
    fast = [k for k in keys if pairs[k][0].dtype in WIDENED and pairs[k][0].numel()]  # max: not of none
    rest = [k for k in keys if k not in fast]
    parts = []
    if fast:
        a = [pairs[k][0].float() for k in fast]
        b = [pairs[k][1].float() for k in fast]
        parts += [torch.stack(torch._foreach_norm(x, p)) for x, p in ((a, 1), (b, 1), (a, float("inf")))]
        parts.append(torch.stack(torch._foreach_norm(torch._foreach_sub(a, b), float("inf"))))
    if rest:
        parts.append(torch.stack([same_mask(*pairs[k]).all() for k in rest]).float())
    v = torch.cat(parts).tolist()
    n = len(fast)
    eq = v[4 * n:]
    for i, k in enumerate(fast):
        sum_a, sum_b, mag, d = v[i], v[n + i], v[2 * n + i], v[3 * n + i]
        if math.isfinite(sum_a) and math.isfinite(sum_b):
            out[k] = Summary(True) if d == 0 else Summary(False, True, max_abs=d, magnitude=mag)
        else:
            rest.append(k)
            eq.append(None)  # not known: read with the statistics
    return rest, eq


def _float_read(pairs: dict, floats: list) -> dict:
    """{key: Summary} of the float pairs found not `same`, in one transfer: which side holds a
    non-finite value, max|a - b| over the finite elements and max|a| over the finite ones."""
    rows = []
    for k in floats:
        a, b = pairs[k]
        fa, fb = torch.isfinite(a), torch.isfinite(b)
        d = torch.where(fa & fb, (a.float() - b.float()).abs(), 0.0)
        m = a.float().abs()
        m = torch.where(torch.isfinite(m), m, 0.0)
        s = same_mask(a, b)
        rows.append(torch.stack([s.all().float(), (~fa & fb).any().float(), (fa & ~fb).any().float(),
                                 (~fa & ~fb & ~s).any().float(), d.max(), m.max()]))
    return {k: Summary(True) if e else Summary(False, True, bool(oa), bool(ob), bool(both), d, m)
            for k, (e, oa, ob, both, d, m) in zip(floats, torch.stack(rows).tolist())}


def first_row(a: torch.Tensor, b: torch.Tensor) -> int:
    """The first index along dim 0 where the copies differ (NaN in both counts as equal)."""
    s = same_mask(a, b)
    bad = ~s.reshape(s.shape[0], -1).all(-1) if s.dim() else ~s.reshape(1)
    return int(bad.int().argmax())


def row_owner(batch, row: int):
    """(request, slot) owning token row `row` of a step."""
    acc = 0
    for rid, slot, q in zip(batch.request_ids, batch.slots, batch.query_lens):
        if row < acc + q:
            return rid, slot
        acc += q
    return None, None


ISLAND_ORDER = ("submod0", "gdn_core", "submod1", "head", "moe")


def ordered(out: dict) -> list[str]:
    """Output keys in data-flow order, so the first difference found is the earliest."""
    return sorted(out, key=lambda k: ISLAND_ORDER.index(k.split(".")[0]))


def compare_outputs(batch, a: dict, b: dict, names=("eager", "replay")) -> Divergence | None:
    """The first output (data-flow order) that differs between two copies' live rows."""
    for key in ordered(a):
        x, y = a[key], b[key]
        if not same(x, y):
            row = first_row(x, y) if x.shape == y.shape else None
            rid, slot = row_owner(batch, row) if row is not None else (None, None)
            isl, name = key.split(".", 1)
            return Divergence(batch.step, isl, name, row, rid, slot,
                              max_abs(x, y) if x.shape == y.shape else float("nan"),
                              nonfinite=nonfinite_side(x, y, names) if x.shape == y.shape else None)
    return None


def block_owner(batch, block: int):
    """The request of this step holding state block `block` (None: no request of the step does)."""
    return next((r for r, blocks in zip(batch.request_ids, batch.block_rows()) if block in blocks), None)


def compare_slots(batch, a: dict, b: dict, slots, island: str = "gdn_core",
                  names=("eager", "replay")) -> Divergence | None:
    """The first state tensor and slot (of `slots`) that differs between two copies' caches."""
    for name, ta in a.items():
        tb = b[name]
        for slot in slots:
            if not same(ta[slot], tb[slot]):
                rid = block_owner(batch, slot)
                return Divergence(batch.step, island, name, None, rid, slot, max_abs(ta[slot], tb[slot]),
                                  nonfinite=nonfinite_side(ta[slot], tb[slot], names))
    return None


def compare_step(batch, eager_out: dict, replay_out: dict, eager, replay) -> Divergence | None:
    """Every island output (live rows), then the state rows of touched and live blocks (every block
    after a dummy run, whose writes go wherever the rows it read point)."""
    div = compare_outputs(batch, eager_out, replay_out)
    if div is not None:
        return div
    if batch.dummy:
        slots = range(eager.cache.conv.shape[0])
    else:
        slots = sorted({b for blocks in batch.block_rows() for b in blocks} | set(batch.live_slots))
    return compare_slots(batch, eager.cache.tensors(), replay.cache.tensors(), slots)
