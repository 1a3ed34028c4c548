"""One scheduler step as the runner sees it (host side), and its device metadata.

`prepare()` builds the step's host tensors (token ids, per-token slots, metadata) once, pinned
when an accelerator is present, so the lockstep can build step k+1's while the device runs step k
(issue 19.2). Every consumer still gets its own device tensors (`ids`, `token_slot_tensor`,
`meta`): a non-blocking copy from the pinned host tensor (a plain `torch.tensor(list,
device=cuda)` is a pageable copy, which synchronises the stream), and a clone on the CPU, so the
eager, replay and probe copies never share an input tensor one of them could corrupt."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .islands.gdn import GDNMeta


@dataclass
class StepBatch:
    """Requests of one step, decodes first then prefills (vLLM's order)."""

    request_ids: list[int]
    slots: list[int]
    query_lens: list[int]
    has_initial_state: list[bool]
    token_ids: list[int]  # flattened, len == sum(query_lens)
    step: int = 0
    live_slots: list[int] = field(default_factory=list)  # slots still owned after this step
    _host: dict | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_decodes(self) -> int:
        n = 0
        for q, h in zip(self.query_lens, self.has_initial_state):
            if q == 1 and h:
                n += 1
            else:
                break
        return n

    @property
    def uniform_decode(self) -> bool:
        return self.num_decodes == len(self.query_lens) and len(self.query_lens) > 0

    def token_slots(self) -> list[int]:
        return [s for s, q in zip(self.slots, self.query_lens) for _ in range(q)]

    def prepare(self, pin: bool | None = None) -> "StepBatch":
        """Build the host tensors of this step once (pinned when `pin`, default: when CUDA is
        available), ahead of the step. Idempotent; `release()` drops them."""
        if self._host is None:
            if pin is None:
                pin = torch.cuda.is_available()
            qsl = [0]
            for q in self.query_lens:
                qsl.append(qsl[-1] + q)
            host = {"ids": torch.tensor(self.token_ids, dtype=torch.long),
                    "token_slots": torch.tensor(self.token_slots(), dtype=torch.int32),
                    "qsl": torch.tensor(qsl, dtype=torch.int32),
                    "slots": torch.tensor(self.slots, dtype=torch.int32),
                    "init": torch.tensor(self.has_initial_state, dtype=torch.bool)}
            self._host = {k: v.pin_memory() for k, v in host.items()} if pin else host
        return self

    def release(self) -> None:
        """Drop the host tensors (after the step: a long run keeps its batches, not their buffers)."""
        self._host = None

    def _dev(self, key: str, device) -> torch.Tensor:
        t = self.prepare()._host[key]
        device = torch.device(device)
        if device.type == "cpu":
            return t.clone()  # a tensor of the consumer's own
        return t.to(device, non_blocking=t.is_pinned())

    def host_ids(self) -> torch.Tensor:
        """The prepared host tensor of token ids (pinned when prepared so): copy it with
        non_blocking, do not keep it past `release()`."""
        return self.prepare()._host["ids"]

    def ids(self, device) -> torch.Tensor:
        """Token ids, int64, on `device` (a tensor of the caller's own)."""
        return self._dev("ids", device)

    def token_slot_tensor(self, device) -> torch.Tensor:
        """Each token's state slot, int32, on `device`."""
        return self._dev("token_slots", device)

    def meta(self, device) -> GDNMeta:
        return GDNMeta(
            query_start_loc=self._dev("qsl", device),
            state_indices=self._dev("slots", device),
            has_initial_state=self._dev("init", device),
            num_decodes=self.num_decodes,
            num_tokens=self.num_tokens,
        )

    def to_json(self) -> dict:
        return {"step": self.step, "request_ids": self.request_ids, "slots": self.slots,
                "query_lens": self.query_lens, "has_initial_state": self.has_initial_state,
                "token_ids": self.token_ids, "live_slots": self.live_slots}
