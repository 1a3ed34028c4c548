"""`forced_comm`: a tensor-parallel slice whose all-reduce sits inside the captured graph (or not).

One rank's slice, fed real token rows like the other islands:

    x    = post_attention_layernorm(embed[input_ids])       replicated on every rank, [T, H]
    gu   = gate_up_r(x)            column-parallel W8A8 shared-expert gate_up, rows [gate_r; up_r]
    h    = silu(gate) * up         SiLU-and-mul (fp32 inside, one rounding to bf16)
    p    = down_r(h)               row-parallel W8A8 shared-expert down: this rank's partial sum
    out  = all_reduce(p)           over the TP group -> [T, H], the same on every rank

Comm modes (how the replay copy places the all-reduce; the eager reference always reduces eagerly):

- `in-graph`: the all-reduce is issued inside the captured region. A CUDA graph captures the NCCL
  kernel; the CPU tape records `c10d.allreduce_` and re-issues (and waits for) it on every replay.
- `noop-capture` (hazard comm-noop-capture, the lab's VLLM_XPU_GRAPH_NOOP_COMM_CAPTURE): while a
  capture is in progress the communicator does nothing (returns its input), so the graph holds no
  collective and every replay returns this rank's unreduced partial sum. It is a Python branch on
  `Communicator.capturing`, frozen into the graph like any other.
- `eager-split` (repair eager-family=comm): the graph ends at the down projection; the all-reduce
  runs eagerly on the graph's output after each replay, as a splitting op would.
- `registered` (hazard allreduce-no-clone, repair clone-input): a registered-buffer all-reduce as
  vLLM's custom all-reduce does it in graph mode (`registered=True`): the down projection's output
  is written into a persistent registered buffer and the collective reads it from there, issued
  asynchronously; the runner overlaps it with the next step (step k+1's piece is launched before
  step k's collective is waited for). The collective's queue lags the compute queue; the model takes
  its worst case, which is also deterministic: the buffer is read when the result is waited for.
  Without `clone-input` step k+1's write into the buffer lands first and step k reduces the wrong
  rows; `clone-input` snapshots the buffer into a private tensor at issue time.
  Nothing here depends on timing: the piece, the snapshot, the overwrite and the read are issued
  in that order on one stream (or run in that order on the CPU). What can hide the hazard is the
  values: step k+1 rewrites only its own rows, and rows whose token ids repeat get the same
  values, so a read of the overwritten buffer can still give the right sum. The race amplifier
  (`amplify`, on by default) therefore holds the buffer and overwrites it with NaN
  right after each issue (the overwrite the hazard is about, with a value no step computes; step
  k+1's own issue poisons the rows it wrote too), so a collective that reads the buffer after its
  issue reads NaN on every step. Every piece writes the rows it issues before issuing them, and
  `clone-input` snapshots them first, so a correct read never sees the poison.

The comm dtype: with 2 ranks a bf16 all-reduce is exact in any order (a + b == b + a). With more
ranks bf16 addition is not associative and ring/tree algorithms order the additions by the
message size, so eager (T rows) and replay (padded rows) would differ by rounding with no bug.
`comm_dtype="auto"` therefore reduces in bf16 at 2 ranks and in fp32 above (bf16 partials summed
in fp32 are exact in practice, so any order gives the same bits after the one rounding back).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..control.dispatch import DEFAULT_SIZES
from ..errors import BadInput
from ..graphs.poison import poison_
from ..model.weights import Linear, MoEWeights
from .base import Island, linear, ops
from ..knobs.hazards import check_comm, options_for
from ..model.checkpoint import Checkpoint

COMM_MODES = ("in-graph", "noop-capture", "eager-split", "registered")
COMM_DTYPES = ("auto", "bf16", "fp32")
DEFAULT_VOCAB = 4096  # embedding rows loaded (token ids are drawn below this)


def comm_mode_for(hazards=(), repairs=()) -> str:
    """The replay copy's comm mode for a set of knobs; refuses knobs this island cannot honour."""
    check_comm(hazards, repairs)
    return options_for(hazards, repairs).comm.mode


def resolve_comm_dtype(comm_dtype: str, tp_size: int) -> torch.dtype:
    if comm_dtype not in COMM_DTYPES:
        raise BadInput(f"unknown comm dtype {comm_dtype!r} (choose from {', '.join(COMM_DTYPES)})")
    if comm_dtype == "auto":
        comm_dtype = "bf16" if tp_size <= 2 else "fp32"
    return torch.bfloat16 if comm_dtype == "bf16" else torch.float32


# --------------------------------------------------------------------------- weights


@dataclass
class SliceWeights:
    embed: torch.Tensor  # bf16 [V', H], the first V' vocabulary rows
    norm: torch.Tensor  # post_attention_layernorm [H] (Gemma style, 1 + w)
    gate_up: Linear  # [2 * Is / n, H], rows [gate_r; up_r]
    down: Linear  # [H, Is / n]
    eps: float
    tp_rank: int = 0
    tp_size: int = 1


def shard_shared_expert(moe: MoEWeights, tp_rank: int, tp_size: int) -> tuple[Linear, Linear]:
    """vLLM's sharding of an unsharded shared expert: gate_up column-parallel keeping [gate_r; up_r],
    down row-parallel (its per-output-channel scale is replicated)."""
    gu, dn = moe.shared_gate_up, moe.shared_down
    Is = dn.in_features
    si = Is // tp_size
    rows = torch.cat([torch.arange(tp_rank * si, (tp_rank + 1) * si), torch.arange(Is + tp_rank * si, Is + (tp_rank + 1) * si)])
    gate_up = Linear(gu.weight.index_select(0, rows).contiguous(),
                     None if gu.scale is None else gu.scale.index_select(0, rows).contiguous())
    down = Linear(dn.weight[:, tp_rank * si:(tp_rank + 1) * si].contiguous(), dn.scale)
    return gate_up, down


def load_slice(checkpoint, layer: int = 0, tp_rank: int = 0, tp_size: int = 1, device="cpu",
               vocab: int | None = DEFAULT_VOCAB) -> SliceWeights:
    """The slice of `layer` for `tp_rank` of `tp_size`. The shared expert comes TP-sharded from the
    checkpoint loader; where `tp_size` does not divide the layer's other sharded dimensions (the
    tiny checkpoint's 2 key heads at TP4) the layer is read whole and only the shared expert is
    sharded here, the same way."""

    ck = checkpoint if isinstance(checkpoint, Checkpoint) else Checkpoint.open(checkpoint)
    cfg = ck.config
    if not isinstance(layer, int) or not 0 <= layer < cfg.num_hidden_layers:
        raise BadInput(f"layer {layer!r} is not a layer of {ck.path} (0..{cfg.num_hidden_layers - 1})")
    Is = cfg.shared_expert_intermediate_size
    if tp_size < 1 or Is % tp_size:
        raise BadInput(f"--tp {tp_size} does not divide the shared expert's intermediate size {Is}")
    if not 0 <= tp_rank < tp_size:
        raise BadInput(f"tp_rank {tp_rank} is not in 0..{tp_size - 1}")
    others = (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.moe_intermediate_size)
    if all(v % tp_size == 0 for v in others):
        lw = ck.load_layer(layer, tp_rank=tp_rank, tp_size=tp_size)
        gate_up, down = lw.moe.shared_gate_up, lw.moe.shared_down
    else:
        lw = ck.load_layer(layer)
        gate_up, down = shard_shared_expert(lw.moe, tp_rank, tp_size)
    rows = None if vocab is None or vocab >= cfg.vocab_size else range(vocab)
    head = ck.load_head(rows)
    dev = torch.device(device)

    def mv(lin: Linear) -> Linear:
        return Linear(lin.weight.to(dev), None if lin.scale is None else lin.scale.to(dev))

    return SliceWeights(embed=head.embed_tokens.to(dev), norm=lw.post_attention_layernorm.to(dev),
                        gate_up=mv(gate_up), down=mv(down), eps=cfg.rms_norm_eps, tp_rank=tp_rank, tp_size=tp_size)


# --------------------------------------------------------------------------- collectives


class Communicator:
    """The island's view of its process group: an out-of-place all-reduce, and whether a capture is
    in progress (vLLM's `graph_capture()` context). `noop_capture` plants comm-noop-capture."""

    def __init__(self, group=None, dtype: torch.dtype | None = None, noop_capture: bool = False):
        self.group = group
        self.dtype = dtype
        self.noop_capture = noop_capture
        self.capturing = False

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.group) if dist.is_available() and dist.is_initialized() else 1

    @contextlib.contextmanager
    def capture(self):
        self.capturing = True
        try:
            yield
        finally:
            self.capturing = False

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """A new tensor holding the sum of `t` over the group (in `dtype`, returned in t's dtype)."""
        if self.capturing and self.noop_capture:
            return t.clone()  # a no-op communicator while capturing: the graph never reduces
        buf = t.to(self.dtype or t.dtype, copy=True, memory_format=torch.contiguous_format)
        if self.world_size > 1:
            dist.all_reduce(buf, group=self.group)
        return buf if buf.dtype == t.dtype else buf.to(t.dtype)


class Done:
    """A result already in hand (the collective, if any, completed)."""

    def __init__(self, out: torch.Tensor):
        self.out = out

    def wait(self) -> torch.Tensor:
        return self.out


class PendingAllReduce:
    """An issued registered all-reduce. Its source is read when it is waited for (the comm queue lags).
    `amplified`: the registered buffer was poisoned right after issue (`RegisteredAllReduce`)."""

    def __init__(self, comm: Communicator, src: torch.Tensor, rows: int, amplified: bool = False):
        self.comm, self.src, self.rows, self.amplified = comm, src, rows, amplified
        self.out: torch.Tensor | None = None

    def wait(self) -> torch.Tensor:
        if self.out is None:
            self.out = self.comm.all_reduce(self.src)[: self.rows]
            self.src = None
        return self.out


class RegisteredAllReduce:
    """A custom all-reduce over a registered, persistent buffer (vLLM `CustomAllreduce` in graph mode,
    `registered=True`; the XPU one behind VLLM_XPU_CUSTOM_ALLREDUCE_CLONE_INPUT). Every captured size
    writes its down projection into the same buffer rows, as graph outputs share one pool."""

    MECHANISM = ("forced: the collective read the registered buffer after it was overwritten; amplified: the buffer "
                 "is held and overwritten with NaN right after each issue")

    def __init__(self, comm: Communicator, rows: int, hidden: int, device, clone_input: bool,
                 amplify: bool = True):
        self.comm = comm
        self.clone_input = clone_input
        self.amplify = amplify
        self.buffer = torch.zeros(rows, hidden, dtype=torch.bfloat16, device=device)
        self.issued = 0

    def issue(self, size: int, rows: int) -> PendingAllReduce:
        src = self.buffer[:size]
        if self.clone_input:
            src = src.clone()  # a private copy taken now, ordered before any later write to the buffer
        self.issued += 1
        amplified = self.amplify and not self.clone_input
        if amplified:
            # the race amplifier: overwrite the held buffer right after the issue. Every size's piece
            # writes the rows it issues before issuing them, so no correct read ever sees this.
            poison_(self.buffer[:size])
        return PendingAllReduce(self.comm, src, rows, amplified)


def eager_all_reduce_probe(group, step: int, hidden: int, device, rows: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch 189403's second half: a plain eager all-reduce on fresh data right after a replay.
    Returns (what the collective gave, the exact sum). Small integers: exact in bf16 in any order."""
    rank = dist.get_rank(group)
    n = dist.get_world_size(group)
    i = torch.arange(rows, device=device).view(-1, 1)
    j = torch.arange(hidden, device=device).view(1, -1)

    def part(r: int) -> torch.Tensor:
        return ((i * 31 + j * 7 + step * 13 + r * 5) % 17 - 8).to(torch.bfloat16)

    got = part(rank).contiguous()
    dist.all_reduce(got, group=group)
    want = sum(part(r).float() for r in range(n)).to(torch.bfloat16)
    return got, want


# --------------------------------------------------------------------------- the island


class ForcedComm(Island):
    """input_ids [T] -> out [T, H]: the TP slice of one layer's shared expert, all-reduced.

    `piece(input_ids)` is what a graph captures; `finish(piece_out, rows)` what runs after a replay
    (nothing, the eager all-reduce, or issuing the registered all-reduce) and returns a handle whose
    `wait()` gives the output; `forward` is the eager reference (piece, finish, wait). Without an
    initialised process group the all-reduce is the identity (one rank: the output is the partial)."""

    name = "forced_comm"
    inputs = ("input_ids",)
    outputs = ("out",)

    def __init__(self, w: SliceWeights, comm: Communicator | None = None, mode: str = "in-graph",
                 clone_input: bool = False, max_tokens: int = 64, amplify: bool = True):
        super().__init__()
        if mode not in COMM_MODES:
            raise BadInput(f"unknown comm mode {mode!r} (choose from {', '.join(COMM_MODES)})")
        self.w = w
        self.comm = comm or Communicator()
        self.mode = mode
        self.registered = None
        if mode == "registered":
            rows = max(max_tokens, max(DEFAULT_SIZES))
            self.registered = RegisteredAllReduce(self.comm, rows, w.embed.shape[1], w.embed.device, clone_input,
                                                  amplify)

    @classmethod
    def build(cls, checkpoint, layer: int = 0, tp_rank: int = 0, tp_size: int = 1, device="cpu", group=None,
              mode: str = "in-graph", comm_dtype: str = "auto", clone_input: bool = False, max_tokens: int = 64,
              vocab: int | None = DEFAULT_VOCAB, weights: SliceWeights | None = None,
              noop_capture: bool | None = None, amplify: bool = True) -> "ForcedComm":
        """`noop_capture` (default: mode == "noop-capture") plants the no-op communicator; with the
        collective split out of the graph (eager-split) it is present but has nothing to skip.
        `amplify`: the registered buffer is poisoned right after each issue (module docstring)."""
        w = weights or load_slice(checkpoint, layer or 0, tp_rank, tp_size, device, vocab)
        noop = mode == "noop-capture" if noop_capture is None else noop_capture
        comm = Communicator(group, resolve_comm_dtype(comm_dtype, tp_size), noop_capture=noop)
        return cls(w, comm, mode, clone_input=clone_input, max_tokens=max_tokens, amplify=amplify)

    @property
    def device(self) -> torch.device:
        return self.w.embed.device

    def partial(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = ops.rms_norm(F.embedding(input_ids, self.w.embed), self.w.norm, self.w.eps)
        gu = linear(x, self.w.gate_up)
        si = gu.shape[1] // 2
        h = (F.silu(gu[:, :si].float()) * gu[:, si:].float()).to(x.dtype)
        return linear(h, self.w.down)

    def piece(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        p = self.partial(input_ids)
        if self.mode in ("in-graph", "noop-capture"):
            return {"out": self.comm.all_reduce(p)}
        if self.mode == "registered":
            buf = self.registered.buffer[: p.shape[0]]
            buf.copy_(p)  # the down projection lands in the registered buffer
            return {"partial": buf}
        return {"partial": p}

    def finish(self, out: dict[str, torch.Tensor], rows: int):
        if self.mode in ("in-graph", "noop-capture"):
            return Done(out["out"][:rows].clone())  # read before the next replay overwrites it
        if self.mode == "registered":
            return self.registered.issue(out["partial"].shape[0], rows)
        return Done(self.comm.all_reduce(out["partial"])[:rows])  # eager-split: the collective between pieces

    def forward(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": self.finish(self.piece(input_ids), input_ids.shape[0]).wait()}
