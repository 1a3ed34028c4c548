"""`repro bench`: eager vs replay per island and for the GDN layer chain, repair costs, and the
memory-bandwidth floor; on the CPU tiny checkpoint, lockstep steps/s and Hypothesis examples/s.

What is timed (decode batches: B requests, one token each, each with its own state slot):

- island rows (`submod0`, `gdn_core`, `submod1`, `moe`): one call of the island on static inputs,
  eager, against one replay of the same island captured as a graph (warm-up, then capture).
- chain rows (`submod0 -> gdn_core -> submod1`), per capture mode, as `GraphRunner` captured it:
  `full` replays the one decode graph; `piecewise` replays graph 0, runs `gdn_core` eagerly on
  its outputs, then replays graph 1. Inputs (token ids, state indices, metadata) are already in
  their static buffers, as a serving stack's input preparation leaves them; eager is the same
  chain called island by island.
- repair rows: `GraphRunner.step` in steady state (the runner's whole step: filling the static
  buffers, replays, the canary head, the copies it returns) with one repair applied at baseline,
  against the same step with no repair; `repair_cost` is their ratio, `eager_us` the
  `EagerRunner.step` of the same batch. Repairs are timed without the race amplifier; on a
  device with streams an `amplifier` row times the step with both stream mechanisms correctly
  ordered, amplified against not (`repair_cost`: what the amplifier adds to a test step).

Floor: the bytes of weights and state a step must read or write at least once (every weight it
uses, read once: the projections, conv weights and gating vectors, norms, embedding rows of the
batch's tokens; for the MoE the router, the shared expert and its gate, and only the experts the
batch's tokens were actually routed to; for `gdn_core` the conv and ssm state rows of the batch,
read and written), divided by the device's copy bandwidth measured in the same run
(`dst.copy_(src)` of a large buffer, counted as bytes read + bytes written). Activations are
left out (they are kilobytes at decode). On CUDA every timed call starts with the L2 cache
flushed (a 256 MiB write), so repeated calls do not read weights from L2 and beat the floor.

Timing: warm-up calls, then the median of `iters` samples; CUDA events around each call on CUDA
(synchronised before it, so host launch time counts, as it does for eager), `perf_counter`
elsewhere. Nothing here asserts a timing; `targets()` reports the issue's two targets as met or
not.
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from .errors import BadInput

BENCH_ISLANDS = ("submod0", "gdn_core", "submod1", "moe")
CHOICES = ("all", "chain") + BENCH_ISLANDS
MODES = ("full", "piecewise")
FLUSH_BYTES = 256 << 20
# Targets of issue 9: the decode chain at batch 1, `full` mode.
TARGET_FLOOR_RATIO = 5.0  # replay within 5x of the bandwidth floor
TARGET_SPEEDUP = 10.0  # replay at least 10x faster than eager


# --------------------------------------------------------------------------- the floor


def nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def linear_bytes(lin) -> int:
    """A `repro.weights.Linear`: its weight and (W8A8) per-channel scale."""
    return nbytes(lin.weight) + nbytes(lin.scale)


def expert_bytes(experts) -> int:
    """Bytes of one routed expert (gate/up, down, their scales)."""
    E = experts.w13.shape[0]
    return sum(nbytes(t) for t in (experts.w13, experts.w13_scale, experts.w2, experts.w2_scale)) // E


def moe_bytes(moe, experts_used: int) -> int:
    """Router + the experts actually used + shared expert and its gate."""
    return (nbytes(moe.gate) + experts_used * expert_bytes(moe.experts) + linear_bytes(moe.shared_gate_up)
            + linear_bytes(moe.shared_down) + nbytes(moe.shared_expert_gate))


def state_row_bytes(cache) -> tuple[int, int]:
    """(conv_state row, ssm_state row) in bytes: what one sequence's decode step reads (and writes)."""
    return nbytes(cache.conv[0]), nbytes(cache.ssm[0])


def floor_bytes(island: str, layer, head, next_norm, cache, batch: int, experts_used: int | None = None) -> int:
    """Bytes of weights and state one decode step of `batch` rows through `island` reads and writes.

    island: submod0 | gdn_core | submod1 | moe | chain. `cache` is a `StateCache` (gdn_core and
    chain); `experts_used` the number of distinct routed experts the batch chose (submod1, moe,
    chain).
    """
    g, m = layer.gdn, layer.moe
    embed_rows = batch * nbytes(head.embed_tokens[0])
    if island == "submod0":
        return (embed_rows + nbytes(layer.input_layernorm)
                + sum(linear_bytes(x) for x in (g.in_proj_qkv, g.in_proj_z, g.in_proj_b, g.in_proj_a)))
    if island == "gdn_core":
        conv_row, ssm_row = state_row_bytes(cache)
        weights = nbytes(g.conv1d_weight) + nbytes(g.A_log) + nbytes(g.dt_bias)
        return weights + 2 * batch * (conv_row + ssm_row)  # each row read once and written once
    if island == "submod1":
        return (nbytes(g.norm_weight) + linear_bytes(g.out_proj) + nbytes(layer.post_attention_layernorm)
                + moe_bytes(m, experts_used) + nbytes(next_norm))
    if island == "moe":
        return embed_rows + nbytes(layer.post_attention_layernorm) + moe_bytes(m, experts_used)
    if island == "chain":
        return sum(floor_bytes(i, layer, head, next_norm, cache, batch, experts_used)
                   for i in ("submod0", "gdn_core", "submod1"))
    raise BadInput(f"no floor for island {island!r}")


def routed_experts_used(moe_weights, x: torch.Tensor, top_k: int) -> int:
    """Distinct experts the rows of x (the MoE's input) are routed to, by the ops' routing rule."""
    from kernels.moe.common import router_probs
    from kernels.moe.vectorized import topk_sorted
    with torch.inference_mode():
        _, ids = topk_sorted(router_probs(x, moe_weights.gate), top_k)
    return int(ids.unique().numel())


class _MoESpy:
    """Stands in for a MoE block for one eager call and keeps the input it was given."""

    def __init__(self, block):
        self.block, self.x = block, None

    def __call__(self, x):
        self.x = x.detach().clone()
        return self.block(x)


# --------------------------------------------------------------------------- timing


class Clock:
    """Median time of a call in microseconds (see the module doc)."""

    def __init__(self, device: torch.device, iters: int = 50, warmup: int = 5, flush: bool | None = None):
        self.device, self.iters, self.warmup = torch.device(device), max(1, iters), max(0, warmup)
        self.cuda = self.device.type == "cuda"
        flush = self.cuda if flush is None else flush
        self.scratch = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=self.device) if flush else None

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        elif self.device.type == "xpu":
            torch.xpu.synchronize(self.device)

    def __call__(self, fn) -> float:
        for _ in range(self.warmup):
            fn()
        self.sync()
        samples = []
        for _ in range(self.iters):
            if self.scratch is not None:
                self.scratch.zero_()
            self.sync()
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                self.sync()
                samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples)


def copy_bandwidth(device, nbytes_: int | None = None, iters: int = 20) -> float:
    """Device copy bandwidth in bytes/s: bytes read + written by `dst.copy_(src)`, median."""
    device = torch.device(device)
    if nbytes_ is None:
        nbytes_ = (1 << 30) if device.type in ("cuda", "xpu") else (64 << 20)
    src = torch.empty(nbytes_, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    clock = Clock(device, iters=iters, warmup=3, flush=False)
    us = clock(lambda: dst.copy_(src))
    return 2 * nbytes_ / (us * 1e-6)


def kernel_profile(fn, device, replays: int = 20, top: int = 25) -> dict:
    """What one call of `fn` spends its time in, from torch.profiler over `replays` calls: on a GPU
    the device kernels (CUPTI sees the kernels a graph replays), on the CPU each op's self time.
    Rows per distinct name, largest first: calls and microseconds per call of `fn`."""
    from torch.profiler import ProfilerActivity, profile
    device = torch.device(device)
    gpu = device.type in ("cuda", "xpu")
    acts = [ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    elif device.type == "xpu":
        acts.append(ProfilerActivity.XPU)
    clock = Clock(device, iters=1, warmup=0, flush=False)
    fn()
    clock.sync()
    with profile(activities=acts) as prof:
        for _ in range(replays):
            fn()
        clock.sync()
    rows = []
    for ev in prof.key_averages():
        us = (getattr(ev, "self_device_time_total", 0) if gpu else ev.self_cpu_time_total)
        if gpu and getattr(ev, "device_type", None) is not None and ev.device_type.name == "CPU":
            continue  # host-side op records (their device time is their kernels', counted once below)
        if us <= 0 and gpu:
            continue
        rows.append({"name": ev.key, "calls_per_replay": round(ev.count / replays, 2),
                     "us_per_replay": round(us / replays, 3)})
    rows.sort(key=lambda k: -k["us_per_replay"])
    total = sum(k["us_per_replay"] for k in rows)
    return {"replays": replays, "what": "device kernels" if gpu else "CPU ops, self time",
            "total_us_per_replay": round(total, 3), "launches_per_replay": round(sum(k["calls_per_replay"] for k in rows), 1),
            "kernels": rows[:top] if top else rows,
            "rest_us_per_replay": round(sum(k["us_per_replay"] for k in rows[top:]) if top else 0.0, 3)}


# --------------------------------------------------------------------------- results


@dataclass
class Row:
    island: str  # submod0 | gdn_core | submod1 | moe | chain
    batch: int
    eager_us: float
    replay_us: float
    floor_us: float | None
    repair: str | None = None  # None: no repair (island / chain rows); "none": the repair baseline
    mode: str | None = None  # chain: full | piecewise; islands: None
    timing: str = "replay"  # "replay" (graphs only) or "runner-step" (repair rows)
    floor_bytes: int | None = None
    experts_used: int | None = None
    repair_cost: float | None = None  # repair rows: replay_us / replay_us without the repair
    profile: dict | None = None  # chain rows with --profile: see kernel_profile()

    @property
    def speedup(self) -> float | None:
        return self.eager_us / self.replay_us if self.replay_us else None

    @property
    def floor_ratio(self) -> float | None:
        return self.replay_us / self.floor_us if self.floor_us else None

    def to_json(self) -> dict:
        r = lambda v, n=2: None if v is None else round(v, n)  # noqa: E731
        return {"island": self.island, "batch": self.batch, "eager_us": r(self.eager_us),
                "replay_us": r(self.replay_us), "floor_us": r(self.floor_us, 3), "repair": self.repair,
                "mode": self.mode, "timing": self.timing, "floor_bytes": self.floor_bytes,
                "experts_used": self.experts_used,
                "replay_over_eager": r(self.replay_us / self.eager_us if self.eager_us else None, 4),
                "eager_over_replay": r(self.speedup, 3), "replay_over_floor": r(self.floor_ratio, 3),
                "repair_cost": r(self.repair_cost, 4), "profile": self.profile}


@dataclass
class BenchResult:
    device: str
    graph_provider: str
    checkpoint: str
    bandwidth: float  # bytes/s
    rows: list[Row] = field(default_factory=list)
    tiny_rates: dict | None = None
    kernels: dict = field(default_factory=dict)
    iters: int = 0
    lockstep_rates: dict | None = None  # lockrates.lockstep_rates() at this checkpoint and device

    def to_json(self) -> dict:
        return {"device": self.device, "graph_provider": self.graph_provider, "torch": torch.__version__,
                "checkpoint": self.checkpoint, "copy_bandwidth_GBps": round(self.bandwidth / 1e9, 1),
                "iters": self.iters, "kernels": self.kernels, "results": [r.to_json() for r in self.rows],
                "tiny_rates": self.tiny_rates, "lockstep_rates": self.lockstep_rates, "targets": targets(self.rows)}


def targets(rows: list[Row]) -> dict:
    """Issue 9's targets for the decode chain at batch 1 in `full` mode (None when not measured)."""
    row = next((r for r in rows if r.island == "chain" and r.mode == "full" and r.batch == 1
                and r.repair is None), None)
    if row is None:
        return {"chain_full_b1": None}
    return {"chain_full_b1": {
        "replay_us": round(row.replay_us, 2), "floor_us": round(row.floor_us, 3),
        "replay_over_floor": round(row.floor_ratio, 3), "eager_over_replay": round(row.speedup, 3),
        "within_5x_of_floor": row.floor_ratio <= TARGET_FLOOR_RATIO,
        "replay_10x_faster_than_eager": row.speedup >= TARGET_SPEEDUP}}


# --------------------------------------------------------------------------- the benches


def decode_meta(batch: int, device, sentinel: int = 0):
    """GDN metadata of a pure decode step: request b in slot b (+1 when slot 0 is the null block)."""
    from .islands.gdn import GDNMeta
    first = 1 if sentinel == 0 else 0
    return GDNMeta(query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=device),
                   state_indices=torch.arange(first, first + batch, dtype=torch.int32, device=device),
                   has_initial_state=torch.ones(batch, dtype=torch.bool, device=device),
                   num_decodes=batch, num_tokens=batch)


def decode_batch(batch: int, token_ids: list[int], sentinel: int = 0):
    from .batch import StepBatch
    first = 1 if sentinel == 0 else 0
    slots = list(range(first, first + batch))
    return StepBatch(request_ids=list(range(batch)), slots=slots, query_lens=[1] * batch,
                     has_initial_state=[True] * batch, token_ids=list(token_ids), live_slots=slots)


def _token_ids(batch: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch,), generator=g).tolist()


def _seed_state(copy, seed: int) -> None:
    """Non-zero states, as a sequence in flight has (zeros would be a special case)."""
    g = torch.Generator().manual_seed(seed)
    for t in copy.cache.tensors().values():
        t.copy_((torch.randn(t.shape, generator=g) * 0.1).to(t.dtype))


def _capture(provider, fn):
    """Warm up, capture `fn` into a fresh pool; returns the graph."""
    fn()
    fn()
    provider.synchronize()
    g, _ = provider.capture(fn, provider.new_pool("bench"))
    provider.synchronize()
    return g


class Bench:
    """Holds the model, the provider and the clock; each method returns rows."""

    def __init__(self, model, provider, clock: Clock, bandwidth: float, seed: int = 0, log=None, profile: int = 0):
        self.model, self.provider, self.clock, self.bandwidth = model, provider, clock, bandwidth
        self.seed, self.profile = seed, profile
        self.log = log or (lambda s: None)

    @property
    def cfg(self):
        return self.model.cfg

    def _floor(self, island, batch, cache=None, experts_used=None) -> tuple[int, float]:
        m = self.model
        b = floor_bytes(island, m.weights, m.head, m.next_norm, cache, batch, experts_used)
        return b, b / self.bandwidth * 1e6

    def _copy(self, batch):
        c = self.model.copy(num_slots=batch)
        _seed_state(c, self.seed)
        return c

    def island(self, name: str, batch: int) -> Row:
        from .islands.moe import MoEIsland
        dev = self.provider.device
        ids = torch.tensor(_token_ids(batch, self.cfg.vocab_size, self.seed + batch), dtype=torch.long, device=dev)
        used = None
        cache = None
        with torch.inference_mode():
            if name == "moe":
                isl = MoEIsland(self.cfg, self.model.weights, self.model.head)
                spy = _MoESpy(isl.block)
                isl.block = spy
                isl(input_ids=ids)
                isl.block = spy.block
                used = routed_experts_used(self.model.weights.moe, spy.x, self.cfg.num_experts_per_tok)
                fn = lambda: isl(input_ids=ids)  # noqa: E731
            else:
                c = self._copy(batch)
                cache = c.cache
                meta = decode_meta(batch, dev, c.cache.sentinel)
                o0 = c.submod0(input_ids=ids)
                if name == "submod0":
                    fn = lambda: c.submod0(input_ids=ids)  # noqa: E731
                elif name == "gdn_core":
                    fn = lambda: c.gdn_core(qkv=o0["qkv"], b=o0["b"], a=o0["a"], core_out=o0["core_out"],  # noqa: E731
                                            meta=meta)
                else:
                    fn0 = lambda: c.gdn_core(qkv=o0["qkv"], b=o0["b"], a=o0["a"], core_out=o0["core_out"],  # noqa: E731
                                             meta=meta)
                    fn0()
                    spy = _MoESpy(c.submod1.moe)
                    c.submod1.moe = spy
                    c.submod1(core_out=o0["core_out"], z=o0["z"], residual=o0["residual"])
                    c.submod1.moe = spy.block
                    used = routed_experts_used(self.model.weights.moe, spy.x, self.cfg.num_experts_per_tok)
                    fn = lambda: c.submod1(core_out=o0["core_out"], z=o0["z"], residual=o0["residual"])  # noqa: E731
            eager = self.clock(fn)
            g = _capture(self.provider, fn)
            replay = self.clock(g.replay)
        fb, fus = self._floor(name, batch, cache, used)
        return Row(name, batch, eager, replay, fus, floor_bytes=fb, experts_used=used)

    def chain(self, batch: int, modes=MODES) -> list[Row]:
        from .runner import GraphRunner
        dev = self.provider.device
        tokens = _token_ids(batch, self.cfg.vocab_size, self.seed + batch)
        step = decode_batch(batch, tokens)
        rows = []
        with torch.inference_mode():
            # eager: the chain island by island, inputs on the device
            e = self._copy(batch)
            ids = torch.tensor(tokens, dtype=torch.long, device=dev)
            meta = decode_meta(batch, dev, e.cache.sentinel)
            spy = _MoESpy(e.submod1.moe)

            def eager_chain():
                return e.chain(ids, meta)[2]

            e.submod1.moe = spy
            eager_chain()
            e.submod1.moe = spy.block
            used = routed_experts_used(self.model.weights.moe, spy.x, self.cfg.num_experts_per_tok)
            eager = self.clock(eager_chain)
            fb, fus = self._floor("chain", batch, e.cache, used)
            for mode in modes:
                c = self._copy(batch)
                runner = GraphRunner(c, self.provider, mode=mode, sizes=(batch,), max_tokens=batch)
                fn = runner.replayer(step)  # captures, then replays as a step does
                replay = self.clock(fn)
                prof = kernel_profile(fn, dev, self.profile) if self.profile else None
                rows.append(Row("chain", batch, eager, replay, fus, mode=mode, floor_bytes=fb, experts_used=used,
                                profile=prof))
        return rows

    def repairs(self, batch: int, modes=MODES) -> list[Row]:
        from .hazards import options_for
        from .runner import EagerRunner, GraphRunner
        tokens = _token_ids(batch, self.cfg.vocab_size, self.seed + batch)
        step = decode_batch(batch, tokens)
        rows = []
        eager_runner = EagerRunner(self._copy(batch))
        eager = self.clock(lambda: eager_runner.step(step))
        for mode in modes:
            base = None
            for repair in ["none"] + applicable_repairs(mode, self.provider.supports_streams):
                opts = options_for((), () if repair == "none" else (repair,))
                runner = GraphRunner(self._copy(batch), self.provider, mode=mode, sizes=(batch,),
                                     opts=replace(opts.runner, amplify=False), max_tokens=batch)
                runner.step(step)  # captures
                t = self.clock(lambda: runner.step(step))
                if repair == "none":
                    base = t
                rows.append(Row("chain", batch, eager, t, None, repair=repair, mode=mode, timing="runner-step",
                                repair_cost=t / base if base else None))
                self.log(f"  repair {repair:<22} {mode:<9} B={batch:<3} {t:9.1f} us")
            if self.provider.supports_streams:
                rows.append(self.amplifier(batch, mode, step, eager))
        return rows

    def amplifier(self, batch: int, mode: str, step, eager: float) -> Row:
        """The race amplifier's cost (`race.py`): the runner's step with both stream mechanisms on
        and correctly ordered (side-stream replay + event-wait, async copy + sync-output-copy),
        amplified against not; `repair_cost` is their ratio. Tests pay it, serving never does."""
        from .hazards import options_for
        from .runner import GraphRunner
        opts = options_for(("side-stream-no-wait", "async-output-copy"), ("event-wait", "sync-output-copy")).runner
        t = {}
        for amp in (False, True):
            runner = GraphRunner(self._copy(batch), self.provider, mode=mode, sizes=(batch,),
                                 opts=replace(opts, amplify=amp), max_tokens=batch)
            runner.step(step)  # captures
            t[amp] = self.clock(lambda: runner.step(step))
        self.log(f"  amplifier {mode:<9} B={batch:<3} {t[False]:9.1f} -> {t[True]:9.1f} us")
        return Row("chain", batch, eager, t[True], None, repair="amplifier", mode=mode, timing="runner-step",
                   repair_cost=t[True] / t[False] if t[False] else None)


def applicable_repairs(mode: str, streams: bool) -> list[str]:
    """Repairs of `hazards.py` that can run at baseline in `mode` on this provider (a repair's
    cost is what it adds when nothing is wrong). Repairs made in the islands' own code (declaring
    a mutation, issuing on the capture stream) change nothing at baseline: left out."""
    from . import hazards as hz
    out: list[str] = []
    for h in hz.planted(mode, streams):
        for r in h.repairs:
            if r in out or all(k.startswith("island.") for k in hz.REPAIRS[r].sets):
                continue
            try:
                hz.check([], [r], mode, streams)
            except BadInput:
                continue
            out.append(r)
    return out


# --------------------------------------------------------------------------- CPU tiny rates


def tiny_rates(steps: int = 60, examples: int = 20, seed: int = 0) -> dict:
    """On the CPU tape with the embedded tiny checkpoint: lockstep steps/s per mode (eager and
    replay copies in lockstep, compared every step) and Hypothesis examples/s at baseline. Runs
    on the default kernel providers: a `--kernels` selection is for the device, not the CPU."""
    from kernels import registry
    with registry.defaults():
        return _tiny_rates(steps, examples, seed)


def _tiny_rates(steps: int, examples: int, seed: int) -> dict:
    from .graphs import TapeProvider
    from .hunt import hunt
    from .islands import Model
    from .job import Case, default_sequence, run_case
    from .tiny import default_checkpoint

    provider = TapeProvider("cpu")
    model = Model(default_checkpoint(), "cpu")
    seq = default_sequence(seed, steps, vocab=model.cfg.vocab_size)
    out: dict = {"checkpoint": "tiny (embedded)", "device": "cpu"}
    for mode in MODES:
        t0 = time.perf_counter()
        r = run_case(model, provider, Case("chain", mode), seq)
        dt = time.perf_counter() - t0
        out[f"lockstep_{mode}_steps"] = r.steps
        out[f"lockstep_{mode}_steps_per_s"] = round(r.steps / dt, 2)
    calls = 0

    def check(s):
        nonlocal calls
        calls += 1
        r = run_case(model, provider, Case("chain", "piecewise"), s)
        if not r.diverged:
            return None
        from .lockstep import Divergence
        fd = r.first_divergence
        return Divergence(fd["step"], fd["island"], fd["tensor"], fd["row"], fd["request"], fd["slot"], fd["max_abs"])

    t0 = time.perf_counter()
    hunt(check, max_examples=examples, profile="ci", vocab=model.cfg.vocab_size)
    dt = time.perf_counter() - t0
    out["hypothesis_examples"] = calls
    out["hypothesis_examples_per_s"] = round(calls / dt, 2)
    return out


# --------------------------------------------------------------------------- driver


def parse_batches(spec: str) -> list[int]:
    try:
        out = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"--batches {spec!r}: expected comma-separated integers, e.g. 1,8,32") from None
    if not out or any(b < 1 for b in out):
        raise BadInput(f"--batches {spec!r}: batch sizes must be >= 1")
    return out


def checkpoint_for(preset: str, device) -> Path:
    """The synthetic checkpoint of a preset: the embedded tiny one, or `real-layer` generated once
    (on `device`, into the cache directory)."""
    from .config import PRESETS
    from .io import cache_dir
    from .tiny import default_checkpoint, make_tiny
    if preset == "tiny":
        return default_checkpoint()
    if preset not in PRESETS or preset == "qwen3.6-35b-a3b":
        raise BadInput(f"--preset {preset!r}: choose tiny or real-layer (pass a real checkpoint with --model)")
    target = cache_dir() / f"{preset}-seed0"
    if not (target / "config.json").is_file():
        t0 = time.perf_counter()
        make_tiny(target, seed=0, preset=preset, device=torch.device(device))
        print(f"wrote {target} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return target


def run_bench(checkpoint, provider, islands=CHOICES[2:], chain: bool = True, repairs: bool = True,
              batches=(1, 8, 32), modes=MODES, iters: int = 50, warmup: int = 5, seed: int = 0,
              rates: bool = False, log=None, profile: int = 0, lockstep_steps: int = 0,
              hunt_examples: int = 20) -> BenchResult:
    from kernels import registry

    from .islands import Model
    from .job import device_name
    log = log or (lambda s: None)
    model = Model(checkpoint, provider.device)
    bw = copy_bandwidth(provider.device)
    log(f"copy bandwidth {bw / 1e9:.1f} GB/s on {device_name(provider)}")
    clock = Clock(provider.device, iters=iters, warmup=warmup)
    bench = Bench(model, provider, clock, bw, seed=seed, log=log, profile=profile)
    res = BenchResult(device_name(provider), provider.name, str(checkpoint), bw, iters=iters,
                      kernels={op: d["selected"] for op, d in registry.describe().items()})
    for b in batches:
        for name in islands:
            row = bench.island(name, b)
            res.rows.append(row)
            log(f"  {name:<9} B={b:<3} eager {row.eager_us:9.1f} us  replay {row.replay_us:9.1f} us  "
                f"floor {row.floor_us:8.2f} us")
        if chain:
            for row in bench.chain(b, modes):
                res.rows.append(row)
                log(f"  chain {row.mode:<9} B={b:<3} eager {row.eager_us:9.1f} us  replay {row.replay_us:9.1f} us  "
                    f"floor {row.floor_us:8.2f} us")
        if repairs:
            res.rows.extend(bench.repairs(b, modes))
    if lockstep_steps:
        from .lockrates import lockstep_rates
        res.lockstep_rates = lockstep_rates(model, provider, steps=lockstep_steps, examples=hunt_examples, seed=seed,
                                            log=log)
    if rates:
        res.tiny_rates = tiny_rates(seed=seed)
    return res


def _f(v, fmt="{:.1f}"):
    return "-" if v is None else fmt.format(v)


def format_table(res: BenchResult) -> str:
    head = ("island", "mode", "B", "repair", "eager us", "replay us", "eager/replay", "floor us", "replay/floor",
            "repair cost")
    rows = [head]
    for r in res.rows:
        rows.append((r.island, r.mode or "-", str(r.batch), r.repair or "-", _f(r.eager_us), _f(r.replay_us),
                     _f(r.speedup, "{:.2f}"), _f(r.floor_us, "{:.2f}"), _f(r.floor_ratio, "{:.2f}"),
                     _f(r.repair_cost, "{:.3f}")))
    widths = [max(len(x[i]) for x in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) if i >= 2 else c.ljust(w) for i, (c, w) in enumerate(zip(x, widths))).rstrip()
             for x in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"copy bandwidth {res.bandwidth / 1e9:.1f} GB/s (read + write), {res.iters} samples a median, "
                 f"provider {res.graph_provider} on {res.device}")
    t = targets(res.rows)["chain_full_b1"]
    if t:
        lines.append(f"target chain full B=1: replay/floor {t['replay_over_floor']:.2f} (<= {TARGET_FLOOR_RATIO:g}: "
                     f"{'met' if t['within_5x_of_floor'] else 'NOT met'}), eager/replay {t['eager_over_replay']:.1f} "
                     f"(>= {TARGET_SPEEDUP:g}: {'met' if t['replay_10x_faster_than_eager'] else 'NOT met'})")
    if res.lockstep_rates:
        from .lockrates import format_rates
        lines.append(format_rates(res.lockstep_rates))
    if res.tiny_rates:
        r = res.tiny_rates
        lines.append(f"CPU tiny: lockstep {r['lockstep_piecewise_steps_per_s']} steps/s piecewise, "
                     f"{r['lockstep_full_steps_per_s']} steps/s full; Hypothesis {r['hypothesis_examples_per_s']} "
                     f"examples/s ({r['hypothesis_examples']} examples)")
    return "\n".join(lines)


def format_profiles(res: BenchResult, top: int = 15) -> str:
    """The --profile breakdowns of the chain rows, one block each."""
    out = []
    for r in res.rows:
        p = r.profile
        if not p:
            continue
        unit = "ops" if p["what"].startswith("CPU") else "launches"
        out.append(f"profile chain {r.mode} B={r.batch}: {p['what']}, {p['total_us_per_replay']:.1f} us and "
                   f"{p['launches_per_replay']:g} {unit} per replay ({p['replays']} replays; replay timed "
                   f"{r.replay_us:.1f} us)")
        for k in p["kernels"][:top]:
            share = k["us_per_replay"] / p["total_us_per_replay"] if p["total_us_per_replay"] else 0.0
            out.append(f"  {k['us_per_replay']:9.2f} us  {share:6.1%}  x{k['calls_per_replay']:<5g} {k['name'][:90]}")
    return "\n".join(out)


def pyplot():
    """matplotlib's pyplot on the Agg backend, or BadInput saying how to get it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BadInput("--plot needs matplotlib, which is not installed here: pip install matplotlib "
                       "(or pip install -e '.[plot]'), or leave --plot out") from None
    return plt


def plot(res: BenchResult, path) -> None:
    """Two panels: replay/eager and replay/floor, one group per island (chain per mode), one bar
    per batch size."""
    plt = pyplot()
    rows = [r for r in res.rows if r.repair is None]
    groups = []
    for r in rows:
        key = r.island if r.mode is None else f"chain {r.mode}"
        if key not in groups:
            groups.append(key)
    batches = sorted({r.batch for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(groups) + 3), 4.2))
    width = 0.8 / max(1, len(batches))
    for ax, (title, value) in zip(axes, (("replay / eager (lower is better)", lambda r: r.replay_us / r.eager_us),
                                         ("replay / bandwidth floor (1 = at the floor)", lambda r: r.floor_ratio))):
        for j, b in enumerate(batches):
            xs, ys = [], []
            for i, gname in enumerate(groups):
                r = next((r for r in rows if r.batch == b and (r.island if r.mode is None else f"chain {r.mode}") == gname),
                         None)
                if r is not None and value(r) is not None:
                    xs.append(i + (j - (len(batches) - 1) / 2) * width)
                    ys.append(value(r))
            ax.bar(xs, ys, width, label=f"B={b}")
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups, rotation=20, ha="right")
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"repro bench: {res.device}, {res.graph_provider}", fontsize=10)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def command_line(a) -> str:
    """The `repro bench` line equivalent to the parsed options (for the JSON and the docs)."""
    parts = ["repro", "bench", "--device", a.device, "--island", a.island, "--batches", a.batches,
             "--iters", str(a.iters), "--warmup", str(a.warmup)]
    parts += ["--model", str(a.model)] if a.model else ["--preset", a.preset]
    for flag, v in (("--mode", a.mode), ("--kernels", a.kernels), ("--json", a.json), ("--plot", a.plot)):
        if v:
            parts += [flag, str(v)]
    parts += [f for f, on in (("--no-repairs", a.no_repairs), ("--no-tiny-rates", a.no_tiny_rates)) if on]
    if a.profile:
        parts += ["--profile", str(a.profile)]
    if getattr(a, "lockstep_rates", False):
        parts += ["--lockstep-rates", "--lockstep-steps", str(a.lockstep_steps), "--hunt-examples",
                  str(a.hunt_examples)]
    return " ".join(parts)


def bench_cli(a) -> int:
    from kernels import registry

    from .graphs import make_provider
    if a.island not in CHOICES:
        raise BadInput(f"unknown island {a.island!r} for bench (choose from {', '.join(CHOICES)})")
    batches = parse_batches(a.batches)
    if a.plot:
        pyplot()  # fail before the work, not after
    with registry.using(**registry.parse(a.kernels or "")):
        return _bench(a, batches)


def _bench(a, batches) -> int:
    from .graphs import make_provider
    provider = make_provider(a.device)
    path = Path(a.model) if a.model else checkpoint_for(a.preset, provider.device)
    modes = (a.mode,) if a.mode else MODES
    islands = BENCH_ISLANDS if a.island == "all" else ((a.island,) if a.island in BENCH_ISLANDS else ())
    chain = a.island in ("all", "chain")
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if not a.quiet else None
    res = run_bench(path, provider, islands=islands, chain=chain, repairs=chain and not a.no_repairs,
                    batches=batches, modes=modes, iters=a.iters, warmup=a.warmup, seed=a.seed,
                    rates=not a.no_tiny_rates, log=log, profile=a.profile,
                    lockstep_steps=a.lockstep_steps if a.lockstep_rates else 0, hunt_examples=a.hunt_examples)
    print(format_table(res))
    if a.profile:
        print(format_profiles(res))
    if a.json:
        from .io import write_json as _write_json
        doc = res.to_json()
        doc["command"] = command_line(a)
        doc["preset"] = None if a.model else a.preset
        _write_json(a.json, doc)
    if a.plot:
        plot(res, a.plot)
        print(f"wrote {a.plot}")
    return 0
