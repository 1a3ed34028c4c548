"""Request sequences: requests arrive with a prompt, decode for a while (with K draft tokens a
step when speculative decoding is on), finish or are preempted; the scheduler turns them into
steps (mixed prefill + decode batches, long prompts in chunks, dummy steps on an idle
data-parallel rank) and allocates, frees and reuses state blocks (reuse is where stale state
bites). Seeded, JSON-able."""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

from ..control.batch import OPTIONAL, StepBatch
from ..errors import BadInput
from ..io import read_json
from .schema import check_json, check_stack
from .prefix import ALIGN_BLOCKS
from .steps import schedule
from ..control.shape import decode_len


def copy_slots(num_slots: int, blocks_per_request: int, spec_tokens: int) -> int:
    """The `num_slots` a layer copy is built with so its state cache, num_slots * (1+K) blocks, holds
    every block of `num_slots` requests: rounded up where a block size's pool is not a multiple of 1+K."""
    return -(-num_slots * blocks_per_request // decode_len(spec_tokens))


@dataclass
class Request:
    rid: int
    prompt_len: int
    decode_steps: int
    arrive: int = 0  # first step it may be scheduled
    preempt_after: int | None = None  # preempted after this many decode steps, then recomputed
    accept: list[int] | None = None  # kept count (1..1+K) of each spec decode, in order, cycled; None: all
    prefix_of: int | None = None  # its first prefix_len prompt tokens are request prefix_of's (a shared prefix)
    prefix_len: int = 0


_SEQ_KEYS = ("num_slots", "max_tokens", "vocab", "seed", "max_steps", "spec_tokens", "data_parallel", "tail_dummies",
             "block_size", "max_num_scheduled_tokens", "long_prefill_token_threshold", "async_scheduling", "dp_peers")
# The scheduler settings a sequence carries only when set (`config.SchedulerConfig`, `dp_peers`): a
# sequence without them is written, read and scheduled as before they existed.
UNSET = {"block_size": None, "max_num_scheduled_tokens": None, "long_prefill_token_threshold": 0,
         "async_scheduling": False, "dp_peers": None}


@dataclass
class Sequence:
    requests: list[Request]
    num_slots: int = 8
    max_tokens: int = 16  # token budget of one step
    vocab: int = 512
    seed: int = 0
    steps: list[dict] = field(default_factory=list)  # explicit steps (a shrunk/replayed sequence)
    max_steps: int | None = None  # cut the scheduled steps to this many
    spec_tokens: int = 0  # K: draft tokens of each decode (0..4)
    data_parallel: bool = False  # one rank of several: it runs a dummy step on each idle tick
    tail_dummies: int = 0  # dummy steps after the last request finishes (data_parallel)
    block_size: int | None = None  # prefix caching's block size (vLLM's mamba cache mode "align"); None: "none"
    # vLLM's SchedulerConfig settings beyond the budget (`scheduler/config.py`)
    max_num_scheduled_tokens: int | None = None  # the scheduler's budget, below max_tokens; None: max_tokens
    long_prefill_token_threshold: int = 0  # a prompt chunk's cap while others run or wait; 0: none
    async_scheduling: bool = False  # the AsyncScheduler: placeholders and a one-step lag
    # data_parallel: the other rank's batch each step, [num_tokens, uniform], cycled (0 tokens: idle)
    dp_peers: list | None = None

    def blocks_per_request(self) -> int:
        """State blocks a request slot adds to the pool: 1+K, or with a block size ALIGN_BLOCKS + K."""
        return (ALIGN_BLOCKS if self.block_size else 1) + self.spec_tokens

    def copy_slots(self) -> int:
        """The `num_slots` a layer copy's state cache is built with (`copy_slots`)."""
        return copy_slots(self.num_slots, self.blocks_per_request(), self.spec_tokens)

    def to_json(self) -> dict:
        d = asdict(self)
        for key, unset in UNSET.items():
            if d[key] == unset:
                del d[key]
        d["requests"] = [request_json(r) for r in self.requests]
        d["steps"] = [b.to_json() for b in self.batches()]
        return d

    @classmethod
    def from_json(cls, d, source: str = "sequence") -> "Sequence":
        """Build from a JSON object after `check_json` (bad input names `source` and the field)."""
        check_json(d, source)
        reqs = [Request(**r) for r in d.get("requests", [])]
        return cls(requests=reqs, steps=[dict(s) for s in d.get("steps", [])], **{k: d[k] for k in _SEQ_KEYS if k in d})

    @classmethod
    def load(cls, path) -> "Sequence":
        """A `--sequence` file: a sequence object, or a `repro hunt` result holding one."""
        return load_sequence(path)[0]

    def check_fits(self, vocab: int, sentinel: int, source: str = "sequence") -> None:
        """What only the run knows: every token id must be a row of the model's embedding, and
        explicit slots and blocks must be state rows the kernel does not treat as padding (with the
        pad sentinel 0, row 0 is the null block and blocks are 1..num_slots*(1+K); with -1,
        0..num_slots*(1+K)-1)."""
        if self.vocab > vocab:
            raise BadInput(f"{source}: vocab {self.vocab} is larger than the model's vocab_size {vocab}")
        n = self.num_slots * self.blocks_per_request()
        lo, hi = (1, n) if sentinel == 0 else (0, n - 1)
        for b in self.steps:
            for key, vals in (("slots", b["slots"]), ("blocks", [x for row in b.get("blocks") or [] for x in row])):
                # with a block size a row's empty columns hold the null block, the one below the lowest
                bad = [x for x in vals if not lo <= x <= hi and not (key == "blocks" and self.block_size and x == lo - 1)]
                if bad:
                    raise BadInput(f"{source}: steps[{b['step']}].{key}: {bad[0]} is out of range {lo}..{hi} "
                                   f"(num_slots {self.num_slots}, spec_tokens {self.spec_tokens}, "
                                   f"pad sentinel {sentinel})")
            bad = [t for t in b["token_ids"] if t >= vocab]
            if bad:
                raise BadInput(f"{source}: steps[{b['step']}].token_ids: {bad[0]} is not below the model's "
                               f"vocab_size {vocab}")

    def batches(self, usable_slots=None) -> list[StepBatch]:
        """The steps: the explicit ones as they were saved, else the scheduler's (`schedule`)."""
        if self.steps:
            return [StepBatch(**{k: s[k] for k in ("request_ids", "slots", "query_lens", "has_initial_state",
                                                   "token_ids", "step")}, live_slots=s.get("live_slots", _owned(s)),
                              **{k: s[k] for k in OPTIONAL if k in s})
                    for s in self.steps]
        return schedule(self, usable_slots)[: self.max_steps]


def load_sequence(path) -> tuple[Sequence, str | None]:
    """A `--sequence` file and the stack profile it records (None: it names none). A hunt's result
    holds its sequence as `minimal_sequence` and the stack it searched as `stack`; a sequence object
    (a report's sequence.json) may say `stack` itself."""
    d = read_json(path, "--sequence")  # one line for a missing, unreadable, non-JSON or too deep file
    source = f"--sequence {path}"
    stack = d.get("stack") if isinstance(d, dict) else None
    if isinstance(d, dict) and "minimal_sequence" in d:
        check_stack(stack, f"{source}: stack")
        d = d["minimal_sequence"]
        stack = stack or (d.get("stack") if isinstance(d, dict) else None)
    return Sequence.from_json(d, source), stack


def request_json(r: Request, always=()) -> dict:
    """A request's JSON object: its optional fields only when set (those in `always` whatever they hold)."""
    d = asdict(r)
    for key, unset in (("accept", None), ("prefix_of", None), ("prefix_len", 0)):
        if d[key] == unset and key not in always:
            del d[key]
    return d


def _owned(step: dict) -> list[int]:
    """A saved step without live_slots: the blocks its requests hold (its slots, before blocks existed)."""
    if step.get("blocks"):
        return sorted(b for row in step["blocks"] for b in row)
    return step["slots"]


def random_sequence(seed: int, num_requests: int = 12, num_slots: int = 8, max_tokens: int = 16,
                    vocab: int = 512, max_decode: int = 24, spec_tokens: int = 0, data_parallel: bool = False,
                    chunked_prefill: bool = False) -> Sequence:
    """A seeded sequence. With the defaults, the draws `repro run`'s rows were made with. With
    K = `spec_tokens` > 0, `chunked_prefill` (prompts longer than the budget) or `data_parallel`:
    prompt lengths concentrated on the scheduler's edges (1, 1+K, and with chunking
    max_tokens+1 and k*max_tokens + 1+K, whose last chunk is decode-shaped), kept-count lists,
    and arrivals in bursts with gaps between them (idle ticks: dummy steps on a data-parallel rank)."""
    rng = random.Random(seed)
    reqs = []
    if not (spec_tokens or data_parallel or chunked_prefill):
        for rid in range(num_requests):
            reqs.append(Request(rid=rid, prompt_len=rng.randint(1, max(1, max_tokens // 2)),
                                decode_steps=rng.randint(1, max_decode), arrive=rng.randint(0, 3 * num_requests),
                                preempt_after=rng.choice([None, None, None, rng.randint(1, 4)])))
        return Sequence(reqs, num_slots=num_slots, max_tokens=max_tokens, vocab=vocab, seed=seed)
    k = spec_tokens
    edges = [1, decode_len(k)]
    if chunked_prefill:
        edges += [max_tokens + 1, max_tokens + decode_len(k), 2 * max_tokens + decode_len(k)]
    top = 3 * max_tokens if chunked_prefill else max(1, max_tokens // 2)
    arrive = 0
    for rid in range(num_requests):
        prompt = rng.choice(edges) if rng.random() < 0.6 else rng.randint(1, top)
        arrive += rng.choice([0, 0, 1, 2, max_decode + 3])
        accept = [rng.randint(1, decode_len(k)) for _ in range(rng.randint(1, 4))] if k else None
        reqs.append(Request(rid=rid, prompt_len=prompt, decode_steps=rng.randint(1, max_decode), arrive=arrive,
                            preempt_after=rng.choice([None, None, None, rng.randint(1, 4)]), accept=accept))
    return Sequence(reqs, num_slots=num_slots, max_tokens=max_tokens, vocab=vocab, seed=seed, spec_tokens=k,
                    data_parallel=data_parallel, tail_dummies=rng.randint(0, 2) if data_parallel else 0)
