"""The third, independent copy: which copy departed, and faults both copies share.

The eager and the replay copy share their weights, the kernel registry and every process-wide
cache, so a fault in any of those moves both the same way and their comparison cannot see it. The
reference copy shares none of it that a step can change:

- its own weights, deep-copied from the model at load (views of one storage stay views) and
  digested then; the digest is checked again whenever the copy reports anything, so a finding is
  never blamed on a corrupted reference;
- the `reference` provider for every op (plain torch, written to be obviously right), selected
  only around its own step; for a fused GDN core (`repro::gdn_attention` under `xpu_semantics` or
  `vllm_xpu`) the plain-torch statement of that kernel's rules (`registry.references`);
- its own state cache and island options (the correct code: no planted knob reaches it).

Every `every` steps (default: every step on the CPU, every 16 on a device, where it runs the
slow reference kernels), and at any step where eager and replay differ (so every failure names
the copy that departed; the cadence only thins the search for faults both copies share), it runs
the step at the exact shape from the eager copy's state before the step, so each step is judged
on its own and rounding never accumulates. Its outputs and whole
new state are held against each copy with the oracle's bound (`oracle.corruption`: providers may
round differently from `reference`). Then:

- eager and replay differ: the one beyond the bound of the reference departed (`replay`,
  `eager`, or `both`);
- eager and replay agree, and both are beyond the bound: shared corruption, `both` departed, a
  failure the two-copy comparison could not see.

Except where the MoE router can have flipped by rounding (`oracle.routing_ties`): an expert flip
moves its token's rows far beyond the ulp budget, and a production kernel that rounds otherwise
than `reference` trips one at a near-tie (seen on an H200 with FLA's GDN kernels, step 784 of a
1000-step run). Those rows are excused and reported as a `routing tie` finding.
"""
from __future__ import annotations

import copy as _copy

import torch

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from kernels import registry
from kernels.moe.reference import routed_on_host

from .compare import summaries
from ..islands.layer import LayerCopy
from ..capture.runner import EagerRunner
from .stepcheck import digest_words
from .oracle import excuse_rows, router_ties
from ..model.weights import copy_weights
from .oracle import corruption

DEVICE_EVERY = 16  # on a GPU the reference kernels cost several eager steps each


def default_every(device) -> int:
    return 1 if torch.device(device).type == "cpu" else DEVICE_EVERY


def independent_copy(model, num_slots: int, sentinel: int, spec_tokens: int = 0) -> LayerCopy:
    """A `LayerCopy` of `model` with its own deep-copied weights and the default island options."""
    layer, head, next_norm = _copy.deepcopy((model.weights, model.head, model.next_norm))
    return LayerCopy(model.cfg, layer, head, next_norm, num_slots, model.device, sentinel=sentinel,
                     tp_size=model.tp_size, spec_tokens=spec_tokens)


class ReferenceCopy:
    """The third copy (module docstring): `run(batch, pre)` one step from state `pre`; `due(i)` on
    the steps it checks; `intact()` its weights unchanged since load. Memory: one more copy of the
    layer's weights and state cache, for the length of a case."""

    def __init__(self, copy: LayerCopy, every: int):
        self.copy, self.every = copy, every
        self.eager = EagerRunner(copy)  # the fixed rules, whatever the case's control path
        self.runs = 0
        self._weights = copy_weights(copy)
        self._digest = _digest(self._weights)

    def due(self, index: int) -> bool:
        """Whether the `index`-th step of the run (0-based) is on the cadence (a step where the copies
        differ is judged whatever the cadence: `Lockstep.step`)."""
        return self.every > 0 and index % self.every == 0

    def run(self, batch, pre: dict) -> dict:
        """The step from state `pre`, reference kernels: outputs and whole new state."""
        for k, v in self.copy.cache.tensors().items():
            v.copy_(pre[k])
        # each op's reference of the provider selected (a fused GDN core's: its semantics, not the composition's)
        with registry.using(**registry.references()), routed_on_host():  # never captured: the used experts only
            out = self.eager.step(batch)
        self.runs += 1
        out.update({f"gdn_core.{k}": v for k, v in self.copy.cache.tensors().items()})
        return out

    def pristine(self, name: str) -> torch.Tensor | None:
        """Its copy of weight `name` (as `weights.copy_weights` names it), or None."""
        return self._weights.get(name)

    def intact(self) -> bool:
        """Its weights still hold the bytes they had at load."""
        return torch.equal(_digest(self._weights), self._digest)


def _digest(weights: dict) -> torch.Tensor:
    return torch.stack([digest_words(t) for t in weights.values()])


def departed(batch, ref: dict, eager: dict, replay: dict, logits=None, routing=None, usage: dict | None = None,
             copies_equal: bool = False):
    """(`replay` / `eager` / `both` / None, why, the first divergence from the reference of the
    copy that departed, {row: why} of the rows a router near-tie explains): which copy is beyond
    the oracle's bound of the reference's outputs and state (`oracle.corruption`; `logits(hidden)`:
    the canary head's, so a near-tie token flip is rounding, not corruption; `routing()`: (the
    reference's MoE input, the eager copy's, router weight, top_k) or None, so a near-tie expert
    flip is too: `oracle.routing_ties`; `usage`: raised as `oracle.corruption` raises it).
    `copies_equal`: the caller has seen eager and replay hold the same bits in every tensor
    compared here (the lockstep's clean device check), so the reference is held against one of
    them and the answer is None or `both`, as it would be from two equal judgements."""
    keys = [k for k in ref if k in eager and k in replay]
    ref = {k: ref[k] for k in keys}
    sums = summaries({k: (ref[k], eager[k]) for k in keys})  # read once, for the ties and the bound
    ties = router_ties(ref, eager, routing, sums)
    if ties:  # replay's rows are excused where they equal eager's (the same router input)
        e_h, r_h = eager["submod1.hidden"], replay["submod1.hidden"]
        eager = excuse_rows(eager, ref, ties)
        replay = excuse_rows(replay, ref, [r for r in ties if torch.equal(r_h[r], e_h[r])])
        sums = None  # eager's excused rows changed its pairs
    off_e = corruption(batch, ref, {k: eager[k] for k in keys}, ("reference", "eager"), logits=logits, usage=usage,
                       sums=sums)
    off_r = off_e if copies_equal else corruption(batch, ref, {k: replay[k] for k in keys}, ("reference", "replay"),
                                                  logits=logits, usage=usage)
    who = {(False, True): "replay", (True, False): "eager", (True, True): "both"}.get((off_e is not None,
                                                                                        off_r is not None))
    if who is None:
        return None, "both copies are within the bound of the independent reference copy", None, ties
    first = off_r if who == "replay" else off_e
    agrees = {"replay": "eager", "eager": "replay"}.get(who)
    why = (f"the independent reference copy (own weights, reference kernels) "
           f"{'agrees with ' + agrees if agrees else 'agrees with neither'}: {who} departed, first at "
           f"{first.island}.{first.tensor} ({first.reason})")
    return who, why, first, ties


class WeightWatch(TorchDispatchMode):
    """While active: the first op after which a watched weight no longer equals its pristine copy
    (`first`: (op, its index among the ops run, weight name)). Custom ops are seen whole, so the op
    named is the kernel that wrote it."""

    def __init__(self, watched: dict):
        super().__init__()
        self.watched = watched  # name -> (live tensor, pristine copy)
        self.calls = 0
        self.first = None
        # the ops handed a watched weight's storage (a one-time write went through one of them)
        self._storage = {live.untyped_storage().data_ptr(): name for name, (live, _) in watched.items()}
        self.handed: dict = {}  # name -> [(op, index)]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.calls += 1
        for t in tree_leaves((args, kwargs or {})):
            name = self._storage.get(t.untyped_storage().data_ptr()) if isinstance(t, torch.Tensor) else None
            if name is not None and len(self.handed.setdefault(name, [])) < 4:
                self.handed[name].append((str(func), self.calls))
        if self.first is None:
            for name, (live, ref) in self.watched.items():
                if not torch.equal(live, ref):
                    self.first = (str(func), self.calls, name)
                    break
        return out


def name_weight_writer(reference: ReferenceCopy, weights: dict, changed: list, rerun) -> str:
    """Which op wrote the changed weights: each is restored from the reference copy's own copy and
    the step is run again eagerly (`rerun()`) under a `WeightWatch`; restored again afterwards.
    Returns the clause the finding gets (empty without a usable reference copy)."""
    pairs = {n: (weights[n], reference.pristine(n)) for n in changed if n in weights}
    pairs = {n: (t, ref) for n, (t, ref) in pairs.items() if ref is not None and ref.shape == t.shape}
    if not pairs or not reference.intact():
        return ""
    for t, ref in pairs.values():
        t.copy_(ref)
    watch = WeightWatch(pairs)
    try:
        with torch.inference_mode(), watch:
            rerun()
    finally:
        for t, ref in pairs.values():
            t.copy_(ref)
    if watch.first is None:
        handed = sorted({c for calls in watch.handed.values() for c in calls}, key=lambda c: c[1])
        who = (f"; the ops the step hands it to: {', '.join(f'{op} (op {i})' for op, i in handed)}" if handed else
               "; no op of the step is handed its storage (a write from outside the step, or through a stray "
               "pointer)")
        return ("; restored from the third copy and the step re-run: nothing wrote it again (a one-time write, "
                f"or one that depends on more than this step){who}")
    op, index, name = watch.first
    return (f"; restored from the third copy and the step re-run: {op} (op {index} of the step's eager run) "
            f"wrote {name} again; the weights are restored")
