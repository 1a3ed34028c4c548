"""The lockstep's per-step check, computed on the device and read by the host in one copy.

Each step, on the device and without a host synchronisation:

- every compared output: one flag, "some element's bit pattern differs" (`bits`); on a CUDA
  device with Triton all of them in one kernel (`outflags.py`: the same test, word by word);
- every state tensor (conv, ssm), whole: one flag per slot, the null block and freed slots
  included;
- every weight tensor: an int64 digest (`digest_words`);
- the replay's padded rows that a later piece reads (`pads`): one flag each, "some element is not
  finite" (padding poison: no live row differs, so the output flags cannot see it).

They are concatenated into one small int64 vector; `read()` copies it to the host once, which is
the step's only synchronisation. Bit patterns (integers of the element's width) make the check
exact and NaN-aware: an identical NaN or inf is equal to itself. The converse is not quite the
old value semantics (+0.0 vs -0.0, or two NaNs with different payloads, differ in bits and not
in value), so a flag is never a verdict: it only says where the exact path (`compare.py`, per
tensor, with first row, owner and |d|) must look; when that finds the values equal, the step
is clean, exactly as before.

Weight digests are the int64 sum of the tensor's bytes read as 64-bit (or 32/16/8-bit) words,
64-bit words added modulo 2**64: any change of a single word changes it, as does any change that
does not preserve the words' sum (a swap of two words would not: documented blind spot). The
widest words keep the sum in the words' own type (no widening cast: on an H200 the int64-word
sum reads 805 MB at the copy bandwidth, the int32-widened one at a sixth of it), and modular
addition does not depend on the reduction's order, so the digest is the same on every run.
Weights are read once per step, so on a GPU at real dimensions this is the dominant extra read
(~2 GB at real dimensions: both expert stacks, the embedding and the head). It is therefore
enqueued first (`begin`), before the step's own work, where the device would otherwise idle while
the host enqueues the eager copy: the digest a step reads is of the weights as the previous step
left them, so a change is reported one step late, naming the step it happened in; `changed_now`
reads the weights at once (after the last step, and at a step whose flags are set).
`weight_every` thins it further (a change is then reported with the range of steps it happened
in).

On a CUDA device the reads of tensors that keep their address for the whole run (the state
caches' slot flags, the weight digests) are each captured once as a CUDA graph and replayed every
step: one launch where there were about forty small ones, the same kernels reading the same
addresses, so the same bits come out (the check's host time, not its device time, was
the cost). The graphs are the checker's own, not the system under test's; a state tensor that
moves (another cache) is captured again.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import outflags
from .compare import ordered
from ..graphs.refusals import collection_paused

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns as integers of the same width (a view: no copy)."""
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    if t.is_floating_point() or t.is_complex():
        return t.view(_INT[t.element_size()])
    return t


def words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as one flat run of the widest integers that tile it (int64, int32,
    int16, else uint8): a view when the tensor is contiguous."""
    t = t if t.is_contiguous() else t.contiguous()
    b = t.reshape(-1).view(torch.uint8) if t.dtype != torch.uint8 else t.reshape(-1)
    for dt, size in ((torch.int64, 8), (torch.int32, 4), (torch.int16, 2)):
        if b.numel() % size == 0:
            try:
                return b.view(dt)
            except RuntimeError:  # misaligned storage offset
                continue
    return b


def digest_words(t: torch.Tensor) -> torch.Tensor:
    """An int64 digest of `t`'s bytes, on its device (see the module doc)."""
    return words(t).sum(dtype=torch.int64) if t.numel() else torch.zeros((), dtype=torch.int64, device=t.device)


def differs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """0-dim bool on the device: some element's bits differ."""
    return (bits(a) != bits(b)).any()


def nonfinite(t: torch.Tensor) -> torch.Tensor:
    """0-dim bool on the device: some element is NaN or infinite."""
    return ~torch.isfinite(t).all() if t.is_floating_point() else torch.zeros((), dtype=torch.bool, device=t.device)


def slots_differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[slots] bool on the device: which slots (dim 0) hold different bits."""
    return (bits(a) != bits(b)).reshape(a.shape[0], -1).any(-1)


@dataclass
class Verdict:
    """What the host learns from one step's vector: where the exact path must look."""
    outputs: list = field(default_factory=list)  # output keys, data-flow order
    slots: dict = field(default_factory=dict)  # state name -> slots whose bits differ, ascending
    weights: list = field(default_factory=list)  # weight names whose digest changed
    poisoned: list = field(default_factory=list)  # padded-row keys holding a non-finite value (not in `clean`)

    @property
    def clean(self) -> bool:
        return not (self.outputs or any(self.slots.values()) or self.weights)


def unique_weights(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop exact duplicates (the same storage, offset, shape and dtype under two names): the
    copies of a model share their weight tensors. Row views of a stacked matrix stay, named."""
    seen, out = set(), {}
    for name, t in named.items():
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device)
        if key not in seen:
            seen.add(key)
            out[name] = t
    return out


class Frozen:
    """`fn()` (tensors of fixed addresses in, one tensor out) as one captured CUDA graph replayed per
    call on a CUDA device, keyed by the addresses it reads; called directly elsewhere. The output is
    the graph's static buffer: the caller consumes it (here: `torch.cat` into the step's vector)
    before the next call."""

    def __init__(self):
        self._graphs: dict = {}

    def __call__(self, key, fn, device: torch.device) -> torch.Tensor:
        if device.type != "cuda":
            return fn()
        hit = self._graphs.get(key)
        if hit is None:
            fn()  # warm-up outside the capture (allocator, kernel selection)
            graph = torch.cuda.CUDAGraph()
            with collection_paused(), torch.cuda.graph(graph):  # no gc inside a capture (`refusals`)
                out = fn()
            hit = self._graphs[key] = (graph, out)
        hit[0].replay()
        return hit[1]


def _addresses(tensors) -> tuple:
    return tuple((t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype) for t in tensors)


class StepCheck:
    """One lockstep's device-side check: `launch` enqueues it, `read` synchronises once."""

    def __init__(self, weights: dict[str, torch.Tensor] | None = None, weight_every: int = 1,
                 outflags: bool | None = None):
        self.outflags = outflags  # one kernel for the output flags (`outflags.py`): None = on CUDA with Triton
        self._outflags: dict = {}  # device -> OutputFlags or None
        self._unread = False  # a launch whose pinned table may still be in flight
        self.weights = unique_weights(weights or {})
        self.weight_every = max(1, weight_every)
        self.base: list[int] | None = None  # the weights' digests when the run began
        self.calls = 0
        self._frozen = Frozen()
        self._digest = None  # this step's digest (`begin`), consumed by `launch`
        if self.weights:
            self.base = self._digests().tolist()

    def _digests(self) -> torch.Tensor:
        ws = list(self.weights.values())
        return self._frozen(("weights", _addresses(ws)), lambda: torch.stack([digest_words(t) for t in ws]),
                            ws[0].device)

    def _slots(self, state_a: dict, state_b: dict) -> torch.Tensor:
        pairs = [(a, state_b[n]) for n, a in state_a.items()]
        return self._frozen(("state", _addresses(t for p in pairs for t in p)),
                            lambda: torch.cat([slots_differ(a, b) for a, b in pairs]), pairs[0][0].device)

    def begin(self) -> bool:
        """At the start of a step, before its own work: enqueue the digest of the weights as the
        previous step left them, if this step is on the `weight_every` schedule (returns whether).
        `launch` adds it to the step's vector; a change it shows happened before this step."""
        self.calls += 1
        self._digest = None
        if self.weights and (self.calls - 1) % self.weight_every == 0:
            self._digest = self._digests()
        return self._digest is not None

    def changed_now(self) -> list[str]:
        """The weights whose digest differs from the run's start, read now (one synchronisation):
        after the last step, and at a step whose flags are set (was a weight written in it?)."""
        if not self.weights:
            return []
        now = self._digests().tolist()
        return [k for k, x, y in zip(self.weights, self.base, now) if x != y]

    def launch(self, out_a: dict, out_b: dict, state_a: dict, state_b: dict, mark=None, pads: dict | None = None):
        """Enqueue the step's flags, with the digest `begin` enqueued (if any); returns what `read`
        needs. `mark(name)`: the lockstep's phase clock (compare). `pads`: padded rows to test for
        non-finite values (key -> the rows)."""
        parts, layout = [], []
        if pads:
            parts.append(torch.stack([nonfinite(t) for t in pads.values()]))
            layout.append(("pads", list(pads)))
        order = ordered(out_a)
        known = []  # output keys whose shape or dtype differ: known on the host
        flags = []
        fast = self._fast(out_a[order[0]].device) if order and not self._unread else None
        group, rows = [], []  # keys flagged by the one kernel, their table rows
        for key in order:
            a, b = out_a[key], out_b[key]
            if a.shape != b.shape or a.dtype != b.dtype:
                known.append(key)
                continue
            if not a.numel():
                continue
            row = outflags.entry(a, b) if fast is not None and len(group) < outflags.MAX and \
                a.device == fast.device else None
            if row is not None:
                group.append(key)
                rows.append(row)
            else:
                flags.append(differs(a, b))
                layout.append(("out", key))
        if flags:
            parts.append(torch.stack(flags))
        if group:
            parts.append(fast(rows))
            layout.append(("outs", group))
            self._unread = True
        if state_a:
            parts.append(self._slots(state_a, state_b))
        for name, a in state_a.items():
            layout.append(("state", name, a.shape[0]))
        if self._digest is not None:  # the graph's static buffer: read here, before the next `begin`
            parts.append(self._digest)
            layout.append(("weights",))
            self._digest = None
        if mark:
            mark("compare")
        vec = torch.cat([p.reshape(-1).to(torch.int64) for p in parts]) if parts else None
        return vec, layout, known, order

    def _fast(self, device: torch.device):
        """The one-kernel output flags for `device`, or None (per-tensor flags)."""
        if device not in self._outflags:
            on = outflags.wanted(device) if self.outflags is None else self.outflags
            self._outflags[device] = outflags.OutputFlags(device) if on else None
        return self._outflags[device]

    def read(self, pending) -> Verdict:
        """The step's one host synchronisation: copy the vector, decode it."""
        vec, layout, known, order = pending
        v = vec.tolist() if vec is not None else []
        self._unread = False
        out = Verdict(outputs=list(known))
        i = 0
        flagged = set(known)
        for item in layout:
            if item[0] == "out":
                if v[i]:
                    flagged.add(item[1])
                i += 1
            elif item[0] == "outs":
                c = outflags.C
                flagged.update(k for j, k in enumerate(item[1]) if any(v[i + j * c:i + (j + 1) * c]))
                i += len(item[1]) * c
            elif item[0] == "pads":
                out.poisoned = [k for j, k in enumerate(item[1]) if v[i + j]]
                i += len(item[1])
            elif item[0] == "state":
                n = item[2]
                out.slots[item[1]] = [s for s in range(n) if v[i + s]]
                i += n
            else:
                now = v[i:i + len(self.weights)]
                out.weights = [k for k, x, y in zip(self.weights, self.base, now) if x != y]
                i += len(self.weights)
        out.outputs = [k for k in order if k in flagged]
        return out
