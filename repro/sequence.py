"""Request sequences: requests arrive with a prompt, decode for a while, finish or are
preempted; a scheduler turns them into steps (mixed prefill + decode batches) and allocates,
frees and reuses state slots (slot reuse is where stale state bites). Seeded, JSON-able."""
from __future__ import annotations

import copy
import json
import random
from dataclasses import asdict, dataclass, field

from .batch import StepBatch
from .errors import BadInput


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
    def from_json(cls, d: dict) -> "Sequence":
        try:
            reqs = [Request(**r) for r in d.get("requests", [])]
            keys = ("num_slots", "max_tokens", "vocab", "seed", "max_steps")
            return cls(requests=reqs, steps=list(d.get("steps", [])), **{k: d[k] for k in keys if k in d})
        except TypeError as e:
            raise BadInput(f"not a request sequence: {e}") from e

    @classmethod
    def load(cls, path) -> "Sequence":
        try:
            with open(path) as f:
                d = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise BadInput(f"cannot read sequence file {path}: {e}") from e
        return cls.from_json(d.get("minimal_sequence", d))

    def batches(self, usable_slots=None) -> list[StepBatch]:
        if self.steps:
            return [StepBatch(**{k: s[k] for k in ("request_ids", "slots", "query_lens", "has_initial_state",
                                                   "token_ids", "step")}, live_slots=s.get("live_slots", s["slots"]))
                    for s in self.steps]
        return schedule(self, usable_slots)[: self.max_steps]


def _token(seed: int, rid: int, pos: int, vocab: int) -> int:
    return (seed * 1_000_003 + rid * 7919 + pos * 104_729 + 12_345) * 2_654_435_761 % (1 << 32) % vocab


def schedule(seq: Sequence, usable_slots=None) -> list[StepBatch]:
    """A FCFS scheduler: decodes first, then prefills that fit the token budget and a free slot.
    Slots are taken lowest first, so a freed slot is reused by the next admitted request."""
    free = sorted(usable_slots if usable_slots is not None else range(1, seq.num_slots + 1))
    waiting = sorted((copy.copy(r) for r in seq.requests), key=lambda r: (r.arrive, r.rid))
    for r in waiting:
        if r.prompt_len < 1 or r.prompt_len > seq.max_tokens:
            raise BadInput(f"request {r.rid}: prompt_len {r.prompt_len} must be 1..{seq.max_tokens} (the step budget)")
    running: list[dict] = []  # {req, slot, done (decodes), pos}
    steps: list[StepBatch] = []
    t = 0
    while waiting or running:
        ids, slots, qlens, init, toks = [], [], [], [], []
        budget = seq.max_tokens
        for run in running:  # decodes
            ids.append(run["req"].rid)
            slots.append(run["slot"])
            qlens.append(1)
            init.append(True)
            toks.append(_token(seq.seed, run["req"].rid, run["pos"], seq.vocab))
            budget -= 1
        admitted = []
        for r in list(waiting):
            if r.arrive > t or not free:
                continue
            plen = r.prompt_len + r._generated if hasattr(r, "_generated") else r.prompt_len
            plen = min(plen, seq.max_tokens)
            if plen > budget:
                break
            slot = free.pop(0)
            waiting.remove(r)
            ids.append(r.rid)
            slots.append(slot)
            qlens.append(plen)
            init.append(False)
            toks.extend(_token(seq.seed, r.rid, p, seq.vocab) for p in range(plen))
            budget -= plen
            admitted.append({"req": r, "slot": slot, "done": 0, "pos": plen})
        if ids:
            still = []
            for run in running:
                run["pos"] += 1
                run["done"] += 1
                r = run["req"]
                if run["done"] >= r.decode_steps:
                    free.append(run["slot"])
                elif r.preempt_after is not None and run["done"] == r.preempt_after and not getattr(r, "_preempted", False):
                    free.append(run["slot"])  # preempted: slot freed, recomputed later from scratch
                    r._preempted = True
                    r._generated = run["done"]
                    r.arrive = t + 1
                    waiting.append(r)
                else:
                    still.append(run)
            for a in admitted:
                if a["req"].decode_steps > 0:
                    still.append(a)
                else:
                    free.append(a["slot"])
            free.sort()
            running = still
            steps.append(StepBatch(ids, slots, qlens, init, toks, step=len(steps),
                                   live_slots=sorted(r["slot"] for r in running)))
        t += 1
        if t > 10_000:
            raise BadInput("the sequence does not finish (a request can never be scheduled)")
    return steps


def random_sequence(seed: int, num_requests: int = 12, num_slots: int = 8, max_tokens: int = 16,
                    vocab: int = 512, max_decode: int = 24) -> Sequence:
    rng = random.Random(seed)
    reqs = []
    for rid in range(num_requests):
        reqs.append(Request(rid=rid, prompt_len=rng.randint(1, max(1, max_tokens // 2)),
                            decode_steps=rng.randint(1, max_decode), arrive=rng.randint(0, 3 * num_requests),
                            preempt_after=rng.choice([None, None, None, rng.randint(1, 4)])))
    return Sequence(reqs, num_slots=num_slots, max_tokens=max_tokens, vocab=vocab, seed=seed)
