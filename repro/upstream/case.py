"""A conformance case: what a `VllmConfig` and the mirror's runner are both built from.

The fields are the runner's own (`repro/capture/runner.py: GraphRunner`, `repro run`'s options):
the checkpoint folder (None: the embedded tiny checkpoint, `repro.model.tiny.default_checkpoint`),
the graph mode as vLLM spells it, K draft tokens, the capture sizes (None: vLLM's default list),
the requests a step may hold, its token budget, prefix caching's block size (None: vLLM's
`mamba_cache_mode="none"`; a size: `"align"` with that block size), and the longest sequence.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..knobs.modes import MODES, GraphMode, parse_mode
from ..model.tiny import default_checkpoint


@dataclass(frozen=True)
class Case:
    mode: str = "full_and_piecewise"  # a `--mode` value, any case: `CUDAGraphMode`'s name
    spec_tokens: int = 0  # K
    sizes: tuple[int, ...] | None = None  # `cudagraph_capture_sizes`; None: vLLM's default list
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 64  # the step's token budget
    max_num_scheduled_tokens: int | None = None  # a scheduled budget below it (None: the batch's)
    long_prefill_token_threshold: int = 0  # a prompt chunk's cap beside other requests (0: none)
    block_size: int | None = None  # None: mamba_cache_mode "none"; else "align" with this block size
    checkpoint: Path | None = None  # a `repro make-tiny` folder; None: the embedded tiny checkpoint
    max_model_len: int = 4096
    cache: Path | None = None  # the cache holding the embedded checkpoint (`$REPRO_CACHE`; None: the default)

    @property
    def graph_mode(self) -> GraphMode:
        """The mode as asked (not yet resolved for GDN: vLLM resolves it, `repro.upstream.dispatch`)."""
        parse_mode(self.mode)  # refuses an unknown name in one line
        return MODES[self.mode.strip().upper().replace("-", "_")]

    @property
    def mamba_cache_mode(self) -> str:
        return "none" if self.block_size is None else "align"

    def model_path(self) -> Path:
        return Path(self.checkpoint) if self.checkpoint is not None else default_checkpoint(self.cache)

    def label(self) -> str:
        sizes = "default" if self.sizes is None else ",".join(map(str, self.sizes))
        block = "" if self.block_size is None else f" block={self.block_size}"
        return (f"{self.mode} K={self.spec_tokens} sizes={sizes} seqs={self.max_num_seqs} "
                f"budget={self.max_num_batched_tokens}{block}")
