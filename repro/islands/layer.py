"""One copy of a GDN layer's islands with its own state cache, and the decode chain written once.

The chain `submod0 -> gdn_core -> submod1` is what vLLM's PIECEWISE split produces around one GDN
layer: the eager reference, the graph runner's eager fallback, the full-mode graph body and the
bench all run this one function.
"""
from __future__ import annotations

import torch

from ..model.config import ModelConfig
from ..knobs.options import IslandOptions
from ..model.weights import HeadWeights, LayerWeights
from ..control.meta import GDNMeta
from .gdn import CanaryHead, GDNCore, StateCache, Submod0, Submod1
from .moe import MoEBlock
from ..control.shape import decode_len


class LayerCopy:
    """One copy (eager or replay) of submod0 -> gdn_core -> submod1 -> canary head, with its
    own state cache; `opts` is what the case's knobs change in this copy's code."""

    def __init__(self, cfg: ModelConfig, layer: LayerWeights, head: HeadWeights, next_norm: torch.Tensor,
                 num_slots: int, device, sentinel: int = 0, opts: IslandOptions = IslandOptions(),
                 tp_size: int = 1, spec_tokens: int = 0):
        self.cfg, self.device = cfg, torch.device(device)
        # a request holds 1+k state blocks (the running one and one per draft token)
        self.spec_tokens = spec_tokens
        self.cache = StateCache(cfg, num_slots * decode_len(spec_tokens), device, tp_size=tp_size, sentinel=sentinel,
                                spec_tokens=spec_tokens)
        self.submod0 = Submod0(cfg, layer, head, tp_size)
        self.gdn_core = GDNCore(cfg, layer, self.cache, tp_size)
        self.moe = MoEBlock(cfg, layer)
        self.submod1 = Submod1(cfg, layer, next_norm, self.moe, tp_size)
        self.head = CanaryHead(cfg, head)
        self.ctx = self.submod0.ctx
        for isl in self.islands():
            isl.opts = opts
            isl.ctx = self.ctx

    def islands(self):
        return (self.submod0, self.gdn_core, self.submod1, self.head)

    def set_context(self, num_tokens: int | None) -> None:
        self.ctx.set(num_actual_tokens=num_tokens)

    def core(self, o0: dict, meta: GDNMeta, rows: int | None = None) -> torch.Tensor:
        """The splitting op on submod0's outputs (their first `rows` rows); returns what it wrote
        (its `core_out` buffer, unless it allocated a fresh tensor)."""
        s = slice(None) if rows is None else slice(0, rows)
        return self.gdn_core(qkv=o0["qkv"][s], b=o0["b"][s], a=o0["a"][s], core_out=o0["core_out"][s],
                             meta=meta)["core_out"]

    def chain(self, input_ids: torch.Tensor, meta: GDNMeta) -> tuple[dict, torch.Tensor, dict]:
        """submod0 -> gdn_core -> submod1: (submod0's outputs, the core output, submod1's outputs)."""
        o0 = self.submod0(input_ids=input_ids)
        core = self.core(o0, meta)
        o1 = self.submod1(core_out=core, z=o0["z"], residual=o0["residual"])
        return o0, core, o1


def collect(o0: dict, o1: dict, ids: torch.Tensor, n: int, core: torch.Tensor | None = None) -> dict:
    """Every island's outputs, live rows only, as the step left them. `core` is what the
    splitting op returned (its `core_out` buffer unless it allocated a fresh tensor).

    Views, not copies: the lockstep compares them, on the same stream, before the
    next replay can overwrite a graph's outputs, so a clone would read exactly the same bytes a
    step later in the queue. Eager outputs are fresh tensors the dict keeps alive. A caller that
    keeps a replay's outputs past the next step must copy them itself."""
    out = {f"submod0.{k}": v[:n] for k, v in o0.items() if k != "core_out"}
    out["gdn_core.core_out"] = (o0["core_out"] if core is None else core)[:n]
    out.update({f"submod1.{k}": v[:n] for k, v in o1.items()})
    out["head.token_ids"] = ids[:n]
    return out
