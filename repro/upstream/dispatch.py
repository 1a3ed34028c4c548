"""vLLM's capture sizes, graph-mode resolution and dispatcher behind the mirror's calls
(`repro.control.dispatch`, `repro.knobs.modes.resolve`).

`Dispatcher(up, cfg, spec)` does what `GPUModelRunner._check_and_update_cudagraph_mode`
(`vllm/v1/worker/gpu_model_runner.py`) does with one GDN attention group: the GDN builder's graph
support (`GDNAttentionMetadataBuilder.get_cudagraph_support`) into
`CompilationConfig.resolve_cudagraph_mode_and_sizes(..., use_v2_model_runner=False)` (the V1 runner,
which rounds the sizes to multiples of 1+K), then `CudagraphDispatcher.initialize_cudagraph_keys`.
Its `asked` sizes are the config's before that resolution (vLLM's default list where the case gave
none), `sizes` after; `keys` and `dispatch` answer in the mirror's types (`BatchDescriptor`,
`Runtime`), so the two compare with `==`. The attention layers' own backend is not consulted: the
mirror takes GDN's support as the model's (the full-attention backend of a Hopper GPU captures any
batch, so the minimum over the groups is GDN's).
"""
from __future__ import annotations

from ..control.dispatch import BatchDescriptor
from ..control.shape import decode_len
from ..knobs.modes import Runtime
from .config import mamba_spec


def runtime(mode) -> Runtime:
    """A `CUDAGraphMode` used as a runtime mode, as the mirror names it."""
    return Runtime[mode.name]


def descriptor(d) -> BatchDescriptor:
    """vLLM's `BatchDescriptor` as the mirror's (no LoRA here: those fields keep their defaults)."""
    assert not d.has_lora and not d.num_active_loras, d
    return BatchDescriptor(d.num_tokens, d.num_reqs, d.uniform)


class Dispatcher:
    """vLLM's resolution and dispatcher for one config (module docstring)."""

    def __init__(self, up, cfg):
        self.up, self.cfg = up, cfg
        cc = cfg.compilation_config
        self.asked = tuple(cc.cudagraph_capture_sizes or ())
        self.q = decode_len(cfg.num_speculative_tokens)
        builder = up.gdn_attn.GDNAttentionMetadataBuilder
        support = builder.get_cudagraph_support(cfg, mamba_spec(up, cfg))
        self.mode = cc.resolve_cudagraph_mode_and_sizes(support, "GDNAttentionBackend", self.q,
                                                        use_v2_model_runner=False)
        self.sizes = tuple(cc.cudagraph_capture_sizes or ()) if self.mode.name != "NONE" else ()
        self.dispatcher = up.cudagraph_dispatcher.CudagraphDispatcher(cfg)
        self.dispatcher.initialize_cudagraph_keys(self.mode, self.q)

    @property
    def keys(self) -> dict[BatchDescriptor, Runtime]:
        """Every graph key the dispatcher holds, with its runtime mode."""
        return {descriptor(d): runtime(m) for m, ds in self.dispatcher.cudagraph_keys.items() for d in ds}

    def dispatch(self, num_tokens: int, uniform: bool) -> tuple[Runtime, BatchDescriptor]:
        """`CudagraphDispatcher.dispatch`, as the runner calls it (no LoRA, every mode allowed)."""
        mode, desc = self.dispatcher.dispatch(num_tokens, uniform_decode=uniform)
        return runtime(mode), descriptor(desc)
