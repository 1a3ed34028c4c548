"""One scheduler step as the runner sees it (host side), and its device inputs.

`prepare()` builds the step's host tensors (token ids, each token's state block) once, pinned when
an accelerator is present, so the lockstep can build step k+1's while the device runs step k.
Every consumer still gets its own device tensors (`on`, or `ids`, `token_slot_tensor` one by one):
a non-blocking copy from the pinned host buffer (a plain `torch.tensor(list, device=cuda)` is a
pageable copy, which synchronises the stream), and a clone on the CPU, so the eager, replay and
probe copies never share an input tensor one of them could corrupt."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch



@dataclass
class StepInputs:
    """One consumer's device copy of a step's inputs (`StepBatch.on`)."""
    ids: torch.Tensor  # int64 [T]
    token_slots: torch.Tensor  # int32 [T]


class PinnedInputs:
    """A step's device inputs (module docstring): its token ids and each token's state block, built
    once into one host buffer (pinned when an accelerator is present), and a copy of their own for
    each consumer. Mixed into `StepBatch`, whose `token_ids`, `slots`, `query_lens` and `_host` it reads."""

    def prepare(self, pin: bool | None = None) -> "StepBatch":
        """Build the host tensors of this step once (pinned when `pin`, default: when CUDA is
        available), ahead of the step. Idempotent; `release()` drops them."""
        if self._host is None:
            if pin is None:
                pin = torch.cuda.is_available()
            # One byte buffer holding every field at an 8-byte aligned offset: one (pinned)
            # allocation and one copy per consumer instead of five, filled through numpy views
            # (five `torch.tensor` calls and a `cat` cost about four times the host time).
            q = np.asarray(self.query_lens, dtype=np.int64)
            fields = (("ids", torch.long, np.asarray(self.token_ids, dtype=np.int64)),
                      ("token_slots", torch.int32, np.repeat(np.asarray(self.slots, dtype=np.int32), q)))
            layout, at = {}, 0
            for k, dt, a in fields:
                layout[k] = (at, a.nbytes, dt)
                at += a.nbytes + (-a.nbytes % 8)
            buf = torch.zeros(at, dtype=torch.uint8, pin_memory=pin)
            view = buf.numpy()
            for k, _, a in fields:
                o, n, _ = layout[k]
                view[o:o + n] = a.view(np.uint8)
            o, n, _ = layout["ids"]
            self._host = {"buf": buf, "layout": layout, "ids": buf[o:o + n].view(torch.long)}
        return self

    def release(self) -> None:
        """Drop the host tensors (after the step: a long run keeps its batches, not their buffers)."""
        self._host = None

    def on(self, device) -> "StepInputs":
        """This step's inputs on `device`, tensors of the caller's own: one non-blocking copy of
        the pinned host buffer (a plain `torch.tensor(list, device=cuda)` is a pageable copy, which
        synchronises the stream), or a clone on the CPU, viewed as the fields."""
        h = self.prepare()._host
        device = torch.device(device)
        buf = h["buf"].clone() if device.type == "cpu" else h["buf"].to(device, non_blocking=h["buf"].is_pinned())
        f = {k: buf[o:o + n].view(dt) for k, (o, n, dt) in h["layout"].items()}
        return StepInputs(f["ids"], f["token_slots"])

    def host_ids(self) -> torch.Tensor:
        """The prepared host tensor of token ids (pinned when prepared so): copy it with
        non_blocking, do not keep it past `release()`."""
        return self.prepare()._host["ids"]

    def ids(self, device) -> torch.Tensor:
        """Token ids, int64, on `device` (a tensor of the caller's own)."""
        return self.on(device).ids

    def token_slot_tensor(self, device) -> torch.Tensor:
        """Each token's state slot, int32, on `device`."""
        return self.on(device).token_slots


@dataclass
class StepBatch(PinnedInputs):
    """One scheduled step as the runner sees it: its requests in order (decodes first, then
    prefills: vLLM's order), each with the tokens scheduled for it (its query) and where its state
    lives. A dummy step (`dummy`) has no requests: what an idle data-parallel rank runs
    (`_dummy_run`) while the other ranks run a real step.

    The per-request lists beyond the first five are optional, for steps written before they existed
    (a saved sequence, a test): absent, a request without initial state is a whole prompt in one
    chunk (`prompt_lens` = its query length, nothing computed), one with initial state is past its
    prompt, no request carries draft tokens, and a request's only state block is its slot (no
    block size: vLLM's mamba cache mode "none")."""

    request_ids: list[int]
    slots: list[int]  # each request's running state block (its first block)
    query_lens: list[int]
    has_initial_state: list[bool]  # tokens of the request were computed before this step
    token_ids: list[int]  # flattened, len == sum(query_lens)
    step: int = 0
    live_slots: list[int] = field(default_factory=list)  # state blocks still owned after this step
    num_computed: list[int] | None = None  # tokens of the request computed before this step
    prompt_lens: list[int] | None = None  # the request's prompt: still prefilling while num_computed < it
    # tokens handed to the runner before the request decodes (vLLM V2's prefill_len): its prompt, or
    # after a preemption the prompt and every token kept before it (None: the prompts)
    prefill_lens: list[int] | None = None
    draft_lens: list[int] | None = None  # draft tokens at the end of the query (K for a spec decode, else 0)
    num_accepted: list[int] | None = None  # tokens the request's previous step kept (1..1+K; 1 otherwise)
    blocks: list[list[int]] | None = None  # the request's state blocks (running first, then K speculative)
    finished: list[int] = field(default_factory=list)  # requests finished or preempted since the last step
    dummy: bool = False  # an idle data-parallel rank's dummy run: no requests
    # Block-aligned prefix caching (`control.prefix`), set only with a block size: `blocks` rows then
    # hold every column up to the running one and its K speculative ones (the null block where a
    # column holds no block), `slots` are the running columns' blocks.
    block_size: int | None = None  # tokens a state block covers; None: each request holds 1+K blocks
    state_cols: list[int] | None = None  # each request's running column, (seq_len - 1) // block_size
    prev_cols: list[int] | None = None  # its running column before this step (-1: nothing computed)
    # [dst, conv_src, conv_offset, ssm_src] blocks: the previous step's boundary states, saved before
    # this step's forward copies (`control.prefix.forward_copies`), a dummy step's too
    post_copies: list[list[int]] = field(default_factory=list)
    # Async scheduling (`vllm/v1/core/sched/async_scheduler.py: AsyncScheduler`): each request's
    # `num_output_placeholders` when this step was scheduled (the tokens of its last step still in
    # flight; None: not async), and the requests scheduled once more after they stopped (the
    # scheduler's one-step lag: their output is dropped)
    num_output_placeholders: list[int] | None = None
    lagged: list[int] = field(default_factory=list)
    # The other data-parallel rank's batch this step, [num_tokens, uniform] (0 tokens: it is idle and
    # runs a dummy step), which the dispatch coordinates with (`control.dispatch.dispatch_step`);
    # None: no coordination (one rank, or a sequence that does not say)
    dp_peer: list | None = None
    _host: dict | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_reqs(self) -> int:
        return len(self.request_ids)

    def computed(self) -> list[int]:
        if self.num_computed is not None:
            return self.num_computed
        return [1 if h else 0 for h in self.has_initial_state]

    def prompts(self) -> list[int]:
        if self.prompt_lens is not None:
            return self.prompt_lens
        return [1 if h else q for q, h in zip(self.query_lens, self.has_initial_state)]

    def is_prefilling(self) -> list[bool]:
        """Each request still in its prompt (vLLM: `num_computed_tokens < num_prompt_tokens`)."""
        return [c < p for c, p in zip(self.computed(), self.prompts())]

    def prefills(self) -> list[int]:
        return self.prefill_lens if self.prefill_lens is not None else self.prompts()

    def drafts(self) -> list[int]:
        return self.draft_lens if self.draft_lens is not None else [0] * self.num_reqs

    def accepted(self) -> list[int]:
        return self.num_accepted if self.num_accepted is not None else [1] * self.num_reqs

    def block_rows(self) -> list[list[int]]:
        return self.blocks if self.blocks is not None else [[s] for s in self.slots]

    @property
    def num_decodes(self) -> int:
        """Leading requests past their prompt with a one-token query and a state to continue."""
        n = 0
        for q, h, pre in zip(self.query_lens, self.has_initial_state, self.is_prefilling()):
            if q == 1 and h and not pre:
                n += 1
            else:
                break
        return n

    @property
    def uniform_decode(self) -> bool:
        return self.num_decodes == len(self.query_lens) and len(self.query_lens) > 0

    def token_slots(self) -> list[int]:
        return [s for s, q in zip(self.slots, self.query_lens) for _ in range(q)]

    def to_json(self) -> dict:
        d = {"step": self.step, "request_ids": self.request_ids, "slots": self.slots,
             "query_lens": self.query_lens, "has_initial_state": self.has_initial_state,
             "token_ids": self.token_ids, "live_slots": self.live_slots}
        for k in OPTIONAL:
            v = getattr(self, k)
            if v not in (None, [], False):
                d[k] = v
        return d


def block_rows(batch: StepBatch, width: int, null: int) -> np.ndarray:
    """Each request's state blocks as block-table rows at least `width` wide (missing columns:
    `null`); as wide as the longest row with a block size."""
    if batch.block_size is not None:
        width = max([width] + [len(b) for b in batch.block_rows()])
    rows = np.full((batch.num_reqs, width), null, dtype=np.int32)
    for i, b in enumerate(batch.block_rows()):
        rows[i, :min(width, len(b))] = b[:width]
    return rows


# The fields a step's JSON carries only when they say something (`StepBatch` docstring).
OPTIONAL = ("num_computed", "prompt_lens", "prefill_lens", "draft_lens", "num_accepted", "blocks", "finished", "dummy",
            "block_size", "state_cols", "prev_cols", "post_copies", "num_output_placeholders", "lagged", "dp_peer")
