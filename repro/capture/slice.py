"""The forced-communication slice's replay runner: one graph per padded size over the slice's
piece, with the communicator's capturing flag raised during each capture."""
from __future__ import annotations

import torch

from ..control.dispatch import DEFAULT_SIZES
from ..islands.forced_comm import Done, ForcedComm, PendingAllReduce
from .piece import IslandRunner, OverIslandRunner


class SliceRunner(OverIslandRunner):
    """The replay copy's runner: `capture.IslandRunner` over the slice's piece, with the
    communicator's capturing flag raised during each capture (the warm-up's collectives run on
    every rank at the same step). Batches above the largest size run eagerly. `launch` returns a
    handle; `wait()` on it gives the step's output rows."""

    def __init__(self, island: ForcedComm, provider, sizes=DEFAULT_SIZES, max_tokens: int = 64):
        self.island = island
        self.runner = IslandRunner(island.piece, provider, sizes, max_tokens, around=island.comm.capture)

    def launch(self, token_ids) -> Done | PendingAllReduce:
        out, n = self.runner.run(token_ids)
        with torch.inference_mode():
            return self.island.finish(out, n)

    def collectives_in_graphs(self) -> int | None:
        """How many collectives the captured graphs hold (the CPU tape lists its ops; device graphs
        do not say: None)."""
        names = [getattr(g.graph, "kernel_names", None) for g in self.runner.graphs.values()]
        if any(n is None for n in names):
            return None
        return sum(1 for n in names for k in n() if k.startswith("c10d."))

    def release(self) -> None:
        """Drop every graph (a live graph holding a captured collective hangs `destroy_process_group`)."""
        self.runner.release()
