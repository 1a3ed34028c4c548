"""Request sequences: requests arrive with a prompt, decode for a while, finish or are
preempted; a scheduler turns them into steps (mixed prefill + decode batches) and allocates,
frees and reuses state slots (slot reuse is where stale state bites). Seeded, JSON-able."""
from __future__ import annotations

import copy
import json
import random
from dataclasses import asdict, dataclass, field

from ..control.batch import StepBatch
from ..errors import BadInput


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
        try:
            with open(path) as f:
                d = json.load(f)
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BadInput(f"--sequence {path}: cannot read ({getattr(e, 'strerror', None) or e})") from e
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


_REQ = {"rid": (int,), "prompt_len": (int,), "decode_steps": (int,), "arrive": (int,), "preempt_after": (int, None)}
_STEP = ("step", "request_ids", "slots", "query_lens", "has_initial_state", "token_ids")
MAX_SLOTS = 4096


def _int(v, src: str, lo: int | None = None, hi: int | None = None, none: bool = False):
    if v is None and none:
        return
    if not isinstance(v, int) or isinstance(v, bool):
        raise BadInput(f"{src}: expected an integer, got {json.dumps(v)[:40]}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise BadInput(f"{src}: {v} is out of range {lo if lo is not None else ''}..{hi if hi is not None else ''}")


def _list(v, src: str) -> list:
    if not isinstance(v, list):
        raise BadInput(f"{src}: expected a list, got {type(v).__name__}")
    return v


def check_json(d, source: str = "sequence") -> None:
    """Refuse, naming the field, any sequence object the scheduler or the runner could not replay
    faithfully: wrong types, missing or unknown keys, out-of-range slots and lengths, duplicate
    slots in a step, steps longer than the token budget (a 300-token step with max_tokens 8 would
    overflow the captured buffers and be reported as a false divergence)."""
    if not isinstance(d, dict):
        raise BadInput(f"{source}: expected a JSON object with requests or steps, got {type(d).__name__}")
    known = {"requests", "num_slots", "max_tokens", "vocab", "seed", "steps", "max_steps"}
    extra = sorted(set(d) - known)
    if extra:
        raise BadInput(f"{source}: unknown key {extra[0]!r} (known: {', '.join(sorted(known))})")
    _int(d.get("num_slots", 8), f"{source}: num_slots", 1, MAX_SLOTS)
    _int(d.get("max_tokens", 16), f"{source}: max_tokens", 1, 65536)
    _int(d.get("vocab", 512), f"{source}: vocab", 1)
    _int(d.get("seed", 0), f"{source}: seed")
    _int(d.get("max_steps"), f"{source}: max_steps", 1, none=True)
    num_slots, max_tokens, vocab = d.get("num_slots", 8), d.get("max_tokens", 16), d.get("vocab", 512)
    reqs = _list(d.get("requests", []), f"{source}: requests")
    steps = _list(d.get("steps", []), f"{source}: steps")
    if not reqs and not steps:
        raise BadInput(f"{source}: no requests and no steps (nothing to replay)")
    for i, r in enumerate(reqs):
        src = f"{source}: requests[{i}]"
        if not isinstance(r, dict):
            raise BadInput(f"{src}: expected an object, got {type(r).__name__}")
        missing = [k for k in ("rid", "prompt_len", "decode_steps") if k not in r]
        if missing:
            raise BadInput(f"{src}: missing key {missing[0]!r}")
        for k in r:
            if k not in _REQ:
                raise BadInput(f"{src}: unknown key {k!r}")
        _int(r["rid"], f"{src}.rid", 0)
        _int(r["prompt_len"], f"{src}.prompt_len", 1, max_tokens)
        _int(r["decode_steps"], f"{src}.decode_steps", 0, 100_000)
        _int(r.get("arrive", 0), f"{src}.arrive", 0, 100_000)
        _int(r.get("preempt_after"), f"{src}.preempt_after", 1, none=True)
    for i, s in enumerate(steps):
        src = f"{source}: steps[{i}]"
        if not isinstance(s, dict):
            raise BadInput(f"{src}: expected an object, got {type(s).__name__}")
        for k in _STEP:
            if k not in s:
                raise BadInput(f"{src}: missing key {k!r}")
        for k in s:
            if k not in _STEP and k != "live_slots":
                raise BadInput(f"{src}: unknown key {k!r}")
        _int(s["step"], f"{src}.step", 0)
        n = len(_list(s["request_ids"], f"{src}.request_ids"))
        if n == 0:
            raise BadInput(f"{src}.request_ids: empty (a step schedules at least one request)")
        for k in ("slots", "query_lens", "has_initial_state"):
            if len(_list(s[k], f"{src}.{k}")) != n:
                raise BadInput(f"{src}.{k}: {len(s[k])} entries, but request_ids has {n}")
        for j, v in enumerate(s["request_ids"]):
            _int(v, f"{src}.request_ids[{j}]", 0)
        for j, v in enumerate(s["slots"]):
            _int(v, f"{src}.slots[{j}]", 0, num_slots)
        if len(set(s["slots"])) != n:
            raise BadInput(f"{src}.slots: duplicate slot {next(x for x in s['slots'] if s['slots'].count(x) > 1)} "
                           "(two requests of one step cannot share a state slot)")
        for j, v in enumerate(s["query_lens"]):
            _int(v, f"{src}.query_lens[{j}]", 1, max_tokens)
        for j, v in enumerate(s["has_initial_state"]):
            if not isinstance(v, bool):
                raise BadInput(f"{src}.has_initial_state[{j}]: expected true or false, got {json.dumps(v)[:40]}")
        toks = _list(s["token_ids"], f"{src}.token_ids")
        if len(toks) != sum(s["query_lens"]):
            raise BadInput(f"{src}.token_ids: {len(toks)} ids, but query_lens sum to {sum(s['query_lens'])}")
        if len(toks) > max_tokens:
            raise BadInput(f"{src}.token_ids: {len(toks)} tokens in one step, more than max_tokens {max_tokens}")
        for j, v in enumerate(toks):
            _int(v, f"{src}.token_ids[{j}]", 0, vocab - 1)
        for j, v in enumerate(_list(s.get("live_slots", []), f"{src}.live_slots")):
            _int(v, f"{src}.live_slots[{j}]", 0, num_slots)


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
