"""A request as the scheduler (`scheduler.Scheduler`) tracks it: what vLLM's `Request` holds that a
step's schedule reads (`vllm/v1/request.py: Request`), and what the sequence says of its life."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Req:
    rid: int
    prompt_len: int  # vLLM's num_prompt_tokens: unchanged by a preemption
    decode_steps: int | None  # decode steps after each (re)admission; None: until `finish`
    arrive: int
    preempt_after: int | None
    accept: list[int] | None
    target: int = 0  # tokens to prefill: the prompt, or prompt + generated when recomputed
    num_computed: int = 0
    decodes: int = 0
    num_accepted: int = 1  # what its next step reports: its last spec decode's kept count, else 1
    pending: bool = False  # its last step was a decode whose kept count is still to be given
    blocks: list[int] = field(default_factory=list)
    drafted: set[int] = field(default_factory=set)  # positions whose kept token is an accepted draft
    taken: int = 0  # accept-list values used
    preempted: bool = False
    drafts: int = 0  # the drafts of its last decode (fewer than K where the budget cut them)
    last_call: int = -2  # the last `step` call that scheduled it (`Scheduler.calls`)
    stopped: bool = False  # async scheduling: it stopped, and its lagged step is still to run
    out: tuple[int, int] = (-1, 0)  # (step, tokens) of its last step that produced output (async placeholders)
    # with a block size: column -> block held, the running column of this step and of the last one
    cols: dict[int, int] = field(default_factory=dict)
    col: int = 0  # the running column in `blocks` this step (0: mode "none")
    prev: int = -1  # the running column before this step, as the runner sees it
    run_col: int = -1  # the running column after its last step (-1: none since admission)
    cached: int = 0  # its first blocks cached so far (vLLM's num_cached_block)
    junction: int = 0  # where its prefix shared with computed blocks outruns the cached states (`BlockPool.shared`)

    def prefill_len(self) -> int:
        """What an admission must compute: every token the request holds (vLLM's num_tokens;
        `Scheduler._preempt_request` sets num_computed_tokens to 0 and `schedule()` schedules
        `num_tokens - num_computed_tokens`). Before its first admission, and while a (re)compute
        is under way, that is its prompt or its recompute (`target`); once it has computed them,
        one more than it computed: the last sampled token, known but not yet computed."""
        if self.target and self.num_computed >= self.target:
            return self.num_computed + 1
        return max(self.prompt_len, self.target)
