"""The scheduler settings beyond the step budget, as vLLM 0.33.0 names them
(`vllm/config/scheduler.py: SchedulerConfig`), each of which gives the runner states the plain
scheduler never does:

- `max_num_scheduled_tokens`: the tokens the scheduler may issue a step, below
  `max_num_batched_tokens` (a sequence's `max_tokens`), from which the runner's capture sizes come
  (`VllmConfig._set_cudagraph_sizes`). Decodes that do not fit it stay parked (running, not
  scheduled) while the ones that do are padded to a capture size above the budget: padded FULL
  decode steps beside parked requests.
- `long_prefill_token_threshold`: a prompt chunk (a resumed request's recompute included) is cut to
  at most this many tokens while more than one request is running or waiting
  (`Scheduler.schedule`: `num_eligible_reqs > 1`), and chunked to the budget left where vLLM chunks
  it; 0 is off. A recompute after a preemption then ends in short chunks: 1 or 1+K tokens.
- `async_scheduling`: the `AsyncScheduler` (`vllm/v1/core/sched/async_scheduler.py`) schedules a
  step before the last one's output is processed: a request scheduled right after a decode or its
  prompt's last chunk carries output placeholders (`Request.num_output_placeholders`, its drafts
  placeholder ids the runner fills on the device), a request that stopped is scheduled once more
  (a lagged step whose output is dropped; this scheduler's `decode_steps` ends by a stop token,
  which the scheduler learns one step late) and a preempted request resumes only after its
  in-flight output has drained (`num_stale_output_tokens`).

The defaults leave the scheduler exactly as it was: a sequence without them schedules the same steps.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import BadInput
from ..control.shape import decode_len


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_scheduled_tokens: int | None = None  # None: max_num_batched_tokens (the sequence's max_tokens)
    long_prefill_token_threshold: int = 0  # 0: no cap
    async_scheduling: bool = False

    def budget(self, max_num_batched_tokens: int) -> int:
        return self.max_num_scheduled_tokens or max_num_batched_tokens

    def check(self, max_num_batched_tokens: int, spec_tokens: int, source: str = "sequence") -> None:
        """A budget that holds one decode and is not above max_num_batched_tokens (vLLM asserts the
        scheduled tokens fit the batch), and a threshold that never cuts a decode: this scheduler
        schedules a decode's 1+K tokens whole (vLLM would cut its drafts)."""
        q = decode_len(spec_tokens)
        n = self.max_num_scheduled_tokens
        if n is not None and not q <= n <= max_num_batched_tokens:
            raise BadInput(f"{source}: max_num_scheduled_tokens {n} is out of range {q}..{max_num_batched_tokens} "
                           f"(one decode of 1+spec_tokens tokens, and no more than max_tokens)")
        t = self.long_prefill_token_threshold
        if t and t < q:
            raise BadInput(f"{source}: long_prefill_token_threshold {t} would cut a decode of 1+spec_tokens = {q} "
                           "tokens (0, or at least 1+spec_tokens)")
