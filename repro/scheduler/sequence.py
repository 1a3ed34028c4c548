"""Request sequences: requests arrive with a prompt, decode for a while, finish or are
preempted; a scheduler turns them into steps (mixed prefill + decode batches) and allocates,
frees and reuses state slots (slot reuse is where stale state bites). Seeded, JSON-able."""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

from ..control.batch import StepBatch
from ..errors import BadInput
from ..io import read_json
from .schema import check_json
from .scheduler import schedule


@dataclass
class Request:
    rid: int
    prompt_len: int
    decode_steps: int
    arrive: int = 0  # first step it may be scheduled
    preempt_after: int | None = None  # preempted after this many decode steps, then recomputed


@dataclass
class Sequence:
    requests: list[Request]
    num_slots: int = 8
    max_tokens: int = 16  # token budget of one step
    vocab: int = 512
    seed: int = 0
    steps: list[dict] = field(default_factory=list)  # explicit steps (a shrunk/replayed sequence)
    max_steps: int | None = None  # cut the scheduled steps to this many

    def to_json(self) -> dict:
        d = asdict(self)
        d["steps"] = [b.to_json() for b in self.batches()]
        return d

    @classmethod
    def from_json(cls, d, source: str = "sequence") -> "Sequence":
        """Build from a JSON object after `check_json` (bad input names `source` and the field)."""
        check_json(d, source)
        reqs = [Request(**r) for r in d.get("requests", [])]
        keys = ("num_slots", "max_tokens", "vocab", "seed", "max_steps")
        return cls(requests=reqs, steps=[dict(s) for s in d.get("steps", [])], **{k: d[k] for k in keys if k in d})

    @classmethod
    def load(cls, path) -> "Sequence":
        """A `--sequence` file: a sequence object, or a `repro hunt` result holding one."""
        d = read_json(path, "--sequence")  # one line for a missing, unreadable, non-JSON or too deep file
        if isinstance(d, dict) and "minimal_sequence" in d:
            d = d["minimal_sequence"]
        return cls.from_json(d, f"--sequence {path}")

    def check_fits(self, vocab: int, sentinel: int, source: str = "sequence") -> None:
        """What only the run knows: every token id must be a row of the model's embedding, and
        explicit slots must be state rows the kernel does not treat as padding (with the pad
        sentinel 0, row 0 is the null block and slots are 1..num_slots; with -1, 0..num_slots-1)."""
        if self.vocab > vocab:
            raise BadInput(f"{source}: vocab {self.vocab} is larger than the model's vocab_size {vocab}")
        lo, hi = (1, self.num_slots) if sentinel == 0 else (0, self.num_slots - 1)
        for b in self.steps:
            bad = [x for x in b["slots"] if not lo <= x <= hi]
            if bad:
                raise BadInput(f"{source}: steps[{b['step']}].slots: {bad[0]} is out of range {lo}..{hi} "
                               f"(num_slots {self.num_slots}, pad sentinel {sentinel})")
            bad = [t for t in b["token_ids"] if t >= vocab]
            if bad:
                raise BadInput(f"{source}: steps[{b['step']}].token_ids: {bad[0]} is not below the model's "
                               f"vocab_size {vocab}")

    def batches(self, usable_slots=None) -> list[StepBatch]:
        if self.steps:
            return [StepBatch(**{k: s[k] for k in ("request_ids", "slots", "query_lens", "has_initial_state",
                                                   "token_ids", "step")}, live_slots=s.get("live_slots", s["slots"]))
                    for s in self.steps]
        return schedule(self, usable_slots)[: self.max_steps]


def random_sequence(seed: int, num_requests: int = 12, num_slots: int = 8, max_tokens: int = 16,
                    vocab: int = 512, max_decode: int = 24) -> Sequence:
    rng = random.Random(seed)
    reqs = []
    for rid in range(num_requests):
        reqs.append(Request(rid=rid, prompt_len=rng.randint(1, max(1, max_tokens // 2)),
                            decode_steps=rng.randint(1, max_decode), arrive=rng.randint(0, 3 * num_requests),
                            preempt_after=rng.choice([None, None, None, rng.randint(1, 4)])))
    return Sequence(reqs, num_slots=num_slots, max_tokens=max_tokens, vocab=vocab, seed=seed)
