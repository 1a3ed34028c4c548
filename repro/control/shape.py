"""A step's shape: the sizes every part of a run agrees on, one frozen value built once from the case
(`StepShape.of`) and passed down to the runners, their control paths and the layer copies.

vLLM's model runner fixes these at start-up and each part reads them from there
(`vllm/v1/worker/gpu_model_runner.py: GPUModelRunner.__init__`): K draft tokens a decode carries, so
a uniform decode's query is 1+K tokens (`uniform_decode_query_len`; `decode_len` here, the one place
the suite computes it); the requests a step may hold (`max_num_seqs`); the step's token budget
(`max_num_batched_tokens`); the capture sizes asked for (`cudagraph_capture_sizes`; None: vLLM's
default list, `control.dispatch.configured_sizes`); prefix caching's block size (mamba cache mode
"align"; None: "none"); whether the rank is one of several data-parallel ranks; and the request
slots a layer copy's state cache is built with (`slots` * (1+K) state blocks).
"""
from __future__ import annotations

from dataclasses import dataclass


def decode_len(spec_tokens: int) -> int:
    """A uniform decode's query length: the token the last step sampled and its K drafts
    (`GPUModelRunner.__init__`: `uniform_decode_query_len = 1 + num_spec_tokens`)."""
    return 1 + spec_tokens


@dataclass(frozen=True)
class StepShape:
    spec_tokens: int = 0  # K
    max_num_seqs: int = 8  # requests a step may hold
    max_tokens: int = 64  # the step's token budget (`max_num_batched_tokens`)
    sizes: tuple[int, ...] | None = None  # the capture sizes asked for; None: vLLM's default list
    block_size: int | None = None  # prefix caching's block size; None: mamba cache mode "none"
    data_parallel: bool = False  # one rank of several (its idle ticks run dummy steps)
    slots: int = 8  # the request slots a layer copy's state cache holds

    def __post_init__(self):
        if self.sizes is not None:
            object.__setattr__(self, "sizes", tuple(self.sizes))

    @property
    def decode_len(self) -> int:
        """1+K (`decode_len`)."""
        return decode_len(self.spec_tokens)

    @classmethod
    def of(cls, seq, max_tokens: int | None = None, sizes=None, slots: int | None = None) -> "StepShape":
        """A sequence's shape (`scheduler.sequence.Sequence`): its K, request slots (vLLM's
        `max_num_seqs`), step budget (or `max_tokens`, where the runner's inputs must hold a larger
        recorded step), block size and data parallelism; `sizes`: the capture sizes asked for;
        `slots`: the layer copies' request slots, where the steps need more than the sequence's own
        (`job.steps.copy_slots`)."""
        return cls(seq.spec_tokens, seq.num_slots, seq.max_tokens if max_tokens is None else max_tokens, sizes,
                   seq.block_size, seq.data_parallel, seq.num_slots if slots is None else slots)
