"""One scheduler step as the runner sees it (host side), and its device metadata."""
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

    def meta(self, device) -> GDNMeta:
        qsl = [0]
        for q in self.query_lens:
            qsl.append(qsl[-1] + q)
        return GDNMeta(
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
            state_indices=torch.tensor(self.slots, dtype=torch.int32, device=device),
            has_initial_state=torch.tensor(self.has_initial_state, dtype=torch.bool, device=device),
            num_decodes=self.num_decodes,
            num_tokens=self.num_tokens,
        )

    def to_json(self) -> dict:
        return {"step": self.step, "request_ids": self.request_ids, "slots": self.slots,
                "query_lens": self.query_lens, "has_initial_state": self.has_initial_state,
                "token_ids": self.token_ids, "live_slots": self.live_slots}
