"""Islands built from one layer's tensors of a checkpoint.

`Model(path, layer=...)` loads the layer (and the embedding / head rows) once; `copy()` builds
a fresh set of islands with its own state cache (the lockstep needs two); `kinds` says what
each island is to a run.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..model.checkpoint import Checkpoint
from ..model.config import GDN
from ..errors import BadInput
from ..knobs.options import IslandOptions
from ..model.weights import fuse_in_proj, to_device
from .gdn import CanaryHead, GDNCore, StateCache, Submod0, Submod1
from .kinds import ISLANDS, KINDS, Kind, Runs, kind
from .layer import LayerCopy
from .moe import MoEBlock, MoEIsland

def check_island(name: str) -> str:
    if name not in ISLANDS:
        raise BadInput(f"unknown island {name!r} (choose from all, chain, {', '.join(ISLANDS)})")
    return name


class Model:
    """One layer of a checkpoint on a device, ready to make island copies."""

    def __init__(self, path: str | Path, device="cpu", layer: int | None = None, island: str = "submod0",
                 tp_rank: int = 0, tp_size: int = 1):
        k = kind(check_island(island))
        self.path = Path(path)
        self.ckpt = Checkpoint.open(path)
        self.cfg = cfg = self.ckpt.config
        self.device = torch.device(device)
        if layer is None:
            layer = cfg.gdn_layers()[0] if k.gdn_layer else 0
        layer_type = cfg.layer_type(layer)
        if k.gdn_layer and layer_type != GDN:
            gdn = cfg.gdn_layers()
            raise BadInput(f"layer {layer} is a {layer_type} layer: island {island} needs a GDN (linear_attention) "
                           f"layer ({', '.join(map(str, gdn[:8]))}{', ...' if len(gdn) > 8 else ''})")
        self.layer = layer
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.weights = to_device(self.ckpt.load_layer(layer, tp_rank=tp_rank, tp_size=tp_size), self.device)
        if self.weights.gdn is not None:
            fuse_in_proj(self.weights.gdn)  # submod0's four projections in one launch
        self.head = to_device(self.ckpt.load_head(), self.device)
        if layer + 1 < cfg.num_hidden_layers:  # submod1 ends with the next layer's input norm
            name = self.ckpt.layer_prefix(layer + 1) + "input_layernorm.weight"
            self.next_norm = self.ckpt.read_tensor(name).to(self.device)
        else:
            self.next_norm = self.head.norm

    def copy(self, opts: IslandOptions = IslandOptions(), num_slots: int = 8, sentinel: int = 0,
             spec_tokens: int = 0) -> LayerCopy:
        """A copy with its own state cache for `num_slots` concurrent requests of 1+k blocks each."""
        return LayerCopy(self.cfg, self.weights, self.head, self.next_norm, num_slots, self.device,
                         sentinel=sentinel, opts=opts, tp_size=self.tp_size, spec_tokens=spec_tokens)


__all__ = ["ISLANDS", "KINDS", "Kind", "Runs", "kind", "Model", "check_island", "Submod0", "GDNCore", "Submod1", "CanaryHead",
           "StateCache", "MoEBlock", "MoEIsland", "LayerCopy"]
