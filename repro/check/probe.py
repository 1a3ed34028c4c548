"""The probe copies the oracle re-runs a mismatching step on: a third copy of the chain's islands
(or of one island), from the eager copy's state before the step, at the exact shape and padded the
way the graph runner pads it; `classify` hands the runs to `oracle.decide`."""
from __future__ import annotations

import torch

from .compare import BATCH_VARIANCE, Divergence
from ..capture.forward import clear_core_out
from ..capture.runner import EagerRunner, preprocess
from ..control.dispatch import pad_size
from ..knobs.modes import Runtime
from ..islands.layer import LayerCopy, collect
from .kernelcase import locate
from .oracle import decide, routing_inputs
class ChainProbe:
    """A third copy of the chain's islands (own state cache, eager island options) that re-runs a
    step from a saved state: at the exact shape (`EagerRunner`) or padded the way the graph
    runner pads it, with correct pads (zero token ids, the kernel's sentinel as state index)."""

    def __init__(self, copy: LayerCopy, runner):
        self.copy, self.runner = copy, runner
        self.eager = EagerRunner(copy, runner.rules, runner.paths)
        copy.moe.keep_input = True  # never captures: the MoE inputs of the last exact and padded runs
        self.moe_in: dict = {}

    def padded_size(self, batch) -> int | None:
        """The row count the replay ran this step at (None: the runner ran it eagerly, or it was a
        dummy run, which has no rows of its own)."""
        return None if batch.dummy else self.runner.graphable(batch)

    def _load(self, state: dict) -> None:
        for k, v in self.copy.cache.tensors().items():
            v.copy_(state[k])

    def _with_state(self, out: dict) -> dict:
        out.update({f"gdn_core.{k}": v.clone() for k, v in self.copy.cache.tensors().items()})
        return out

    def exact(self, batch, pre: dict) -> dict:
        self._load(pre)
        out = self._with_state(self.eager.step(batch))
        self.moe_in["exact"] = self.copy.moe.last_input
        return out

    def routing(self):
        """(the last exact run's MoE input, the last padded run's, router weight, top_k), or None."""
        return routing_inputs(self.moe_in.get("exact"), self.moe_in.get("padded"), self.copy.moe)

    def padded(self, batch, pre: dict, size: int) -> dict:
        """The step as the graph runner pads it, run eagerly with correct pads: in FULL the whole chain
        at `size` tokens with padded rows on the kernel's sentinel; in PIECEWISE submod0 and submod1 at
        `size` rows and the splitting op on the live rows."""
        self._load(pre)
        c, r, n = self.copy, self.runner, batch.num_tokens
        dev = c.device
        ids = torch.zeros(size, dtype=torch.long, device=dev)
        ids[:n] = torch.tensor(batch.token_ids, dtype=torch.long, device=dev)
        c.set_context(n)
        runtime, desc = r.dispatch(batch)
        with torch.inference_mode():
            accepted = preprocess(c, batch)  # the step's forward copies, as every copy makes them
            if runtime is Runtime.FULL:
                meta = self.eager.path.metadata(batch, accepted, desc.num_reqs - batch.num_reqs, size)
                o0, core, o1 = c.chain(ids, meta)
            else:  # submod0 padded, the splitting op on live rows, submod1 padded unless it runs eagerly
                o0 = c.submod0(input_ids=ids)
                clear_core_out(o0, size)  # as the runner does: pad rows zero
                core = c.core(o0, self.eager.meta(batch, accepted), n)
                if {"submod1", "moe"} & set(r.opts.eager_families):
                    o1 = c.submod1(core_out=core, z=o0["z"][:n], residual=o0["residual"][:n])
                else:
                    if core.data_ptr() != o0["core_out"].data_ptr():
                        o0["core_out"][:n].copy_(core)
                    o1 = c.submod1(core_out=o0["core_out"], z=o0["z"], residual=o0["residual"])
            tok = c.head(hidden=o1["hidden"][:n])["token_ids"]
        self.moe_in["padded"] = c.moe.last_input
        return self._with_state(collect(o0, o1, tok, n, core))

    def classify(self, batch, div: Divergence, eager: dict, replay: dict, pre: dict) -> Divergence:
        """`eager`/`replay`: each copy's outputs plus its whole state (`gdn_core.<name>` keys)."""
        self.moe_in.clear()
        exact = (self.exact(batch, pre), self.exact(batch, pre))
        size = self.padded_size(batch)
        padded = (self.padded(batch, pre, size), self.padded(batch, pre, size)) if size is not None else None
        rerun = (lambda: self.padded(batch, pre, size)) if size is not None else (lambda: self.exact(batch, pre))
        return decide(batch, div, eager, replay, exact, padded, size, self.logits, rerun,
                      lambda: self.exact(batch, pre), self.routing)

    def kernel_case(self, batch, kind: str, pre: dict):
        """The kernel call that shows a `kind` finding at this step (`kernelcase.locate`), or None."""
        size = self.padded_size(batch)
        exact = lambda: self.exact(batch, pre)
        padded = (lambda: self.padded(batch, pre, size)) if size is not None else exact
        if kind == BATCH_VARIANCE:
            return locate(kind, exact, padded)
        return locate(kind, exact, exact) or locate(kind, padded, padded)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The canary head's fp32 logits for `hidden` rows (what its greedy token is taken from)."""
        h = self.copy.head
        with torch.inference_mode():
            x = torch.ops.repro.rms_norm(hidden, h.norm, h.cfg.rms_norm_eps)
            return torch.nn.functional.linear(x, h.lm_head).float()


class IslandProbe:
    """The same for one island fed token ids (the `moe` island): exact, and zero-padded to `size`."""

    def __init__(self, island, sizes):
        self.island, self.sizes = island, tuple(sorted(sizes))

    def _run(self, batch, size: int) -> dict:
        n = batch.num_tokens
        ids = torch.zeros(size, dtype=torch.long)
        ids[:n] = torch.tensor(batch.token_ids, dtype=torch.long)
        with torch.inference_mode():
            out = self.island(input_ids=ids.to(self.island.embed.device))
        return {f"{self.island.name}.{k}": v[:n].clone() for k, v in out.items()}

    def kernel_case(self, batch, kind: str):
        """The kernel call that shows a `kind` finding at this step (`kernelcase.locate`), or None."""
        n = batch.num_tokens
        size = pad_size(n, self.sizes) or n
        exact, padded = (lambda: self._run(batch, n)), (lambda: self._run(batch, size))
        if kind == BATCH_VARIANCE:
            return locate(kind, exact, padded)
        return locate(kind, exact, exact) or locate(kind, padded, padded)

    def classify(self, batch, div: Divergence, eager: dict, replay: dict) -> Divergence:
        n = batch.num_tokens
        size = pad_size(n, self.sizes)
        exact = (self._run(batch, n), self._run(batch, n))
        padded = (self._run(batch, size), self._run(batch, size)) if size is not None else None
        return decide(batch, div, eager, replay, exact, padded, size, rerun=lambda: self._run(batch, size or n),
                      rerun_exact=lambda: self._run(batch, n))
