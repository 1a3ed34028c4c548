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
elsewhere. Nothing here asserts a timing; `targets()` reports the two targets for the decode chain
(replay within 5x of the floor, at least 10x faster than eager) as met or not.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..errors import BadInput
from .floor import floor_bytes, routed_experts_used, _MoESpy
from .timing import Clock, copy_bandwidth, kernel_profile
from ..control.meta import GDNMeta
from ..control.batch import StepBatch
from ..control.dispatch import PLATFORM_CEILING
from ..knobs import hazards as hz
from ..model.config import PRESETS
from ..io import cache_dir
from ..model.tiny import default_checkpoint, make_tiny
from ..islands import Model
from ..job.results import device_name
from .lockrates import lockstep_rates
from .lockrates import tiny_rates
from ..islands.moe import MoEIsland
from ..capture.runner import GraphRunner
from ..knobs.hazards import options_for
from ..capture.runner import EagerRunner
from ..control.shape import StepShape


BENCH_ISLANDS = ("submod0", "gdn_core", "submod1", "moe")
CHOICES = ("all", "chain") + BENCH_ISLANDS
MODES = ("full", "piecewise")
# The targets: the decode chain at batch 1, `full` mode.
TARGET_FLOOR_RATIO = 5.0  # replay within 5x of the bandwidth floor
TARGET_SPEEDUP = 10.0  # replay at least 10x faster than eager


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
        r = lambda v, n=2: None if v is None else round(v, n)
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
    """The targets for the decode chain at batch 1 in `full` mode (None when not measured)."""
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
    first = 1 if sentinel == 0 else 0
    return GDNMeta(batch, num_decodes=batch, num_decode_tokens=batch,
                   non_spec_query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=device),
                   non_spec_state_indices=torch.arange(first, first + batch, dtype=torch.int32, device=device),
                   has_initial_state=torch.ones(batch, dtype=torch.bool, device=device))


def decode_batch(batch: int, token_ids: list[int], sentinel: int = 0):
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
                fn = lambda: isl(input_ids=ids)
            else:
                c = self._copy(batch)
                cache = c.cache
                meta = decode_meta(batch, dev, c.cache.sentinel)
                o0 = c.submod0(input_ids=ids)
                if name == "submod0":
                    fn = lambda: c.submod0(input_ids=ids)
                elif name == "gdn_core":
                    fn = lambda: c.gdn_core(qkv=o0["qkv"], b=o0["b"], a=o0["a"], core_out=o0["core_out"],
                                            meta=meta)
                else:
                    fn0 = lambda: c.gdn_core(qkv=o0["qkv"], b=o0["b"], a=o0["a"], core_out=o0["core_out"],
                                             meta=meta)
                    fn0()
                    spy = _MoESpy(c.submod1.moe)
                    c.submod1.moe = spy
                    c.submod1(core_out=o0["core_out"], z=o0["z"], residual=o0["residual"])
                    c.submod1.moe = spy.block
                    used = routed_experts_used(self.model.weights.moe, spy.x, self.cfg.num_experts_per_tok)
                    fn = lambda: c.submod1(core_out=o0["core_out"], z=o0["z"], residual=o0["residual"])
            eager = self.clock(fn)
            g = _capture(self.provider, fn)
            replay = self.clock(g.replay)
        fb, fus = self._floor(name, batch, cache, used)
        return Row(name, batch, eager, replay, fus, floor_bytes=fb, experts_used=used)

    def chain(self, batch: int, modes=MODES) -> list[Row]:
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
                runner = GraphRunner(c, self.provider, mode=mode, shape=StepShape(max_tokens=batch, sizes=(batch,)))
                fn = runner.replayer(step)  # captures, then replays as a step does
                replay = self.clock(fn)
                prof = kernel_profile(fn, dev, self.profile) if self.profile else None
                rows.append(Row("chain", batch, eager, replay, fus, mode=mode, floor_bytes=fb, experts_used=used,
                                profile=prof))
        return rows

    def repairs(self, batch: int, modes=MODES) -> list[Row]:
        tokens = _token_ids(batch, self.cfg.vocab_size, self.seed + batch)
        step = decode_batch(batch, tokens)
        rows = []
        eager_runner = EagerRunner(self._copy(batch))
        eager = self.clock(lambda: eager_runner.step(step))
        for mode in modes:
            base = None
            for repair in ["none"] + applicable_repairs(mode, self.provider.supports_streams):
                opts = options_for((), () if repair == "none" else (repair,))
                runner = GraphRunner(self._copy(batch), self.provider, mode=mode,
                                     shape=StepShape(max_tokens=batch, sizes=(batch,)),
                                     opts=replace(opts.runner, amplify=False))
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
        """The race amplifier's cost (`repro/capture/race.py`): the runner's step with both stream
        mechanisms on and correctly ordered (side-stream replay + event-wait, async copy +
        sync-output-copy), amplified against not; `repair_cost` is their ratio. Tests pay it,
        serving never does."""
        races = [h for h in hz.planted(mode, True) if h.stream]  # the stream hazards of the chain
        opts = hz.options_for([h.name for h in races], [h.repairs[0] for h in races]).runner
        t = {}
        for amp in (False, True):
            runner = GraphRunner(self._copy(batch), self.provider, mode=mode,
                                 shape=StepShape(max_tokens=batch, sizes=(batch,)), opts=replace(opts, amplify=amp))
            runner.step(step)  # captures
            t[amp] = self.clock(lambda: runner.step(step))
        self.log(f"  amplifier {mode:<9} B={batch:<3} {t[False]:9.1f} -> {t[True]:9.1f} us")
        return Row("chain", batch, eager, t[True], None, repair="amplifier", mode=mode, timing="runner-step",
                   repair_cost=t[True] / t[False] if t[False] else None)


def applicable_repairs(mode: str, streams: bool) -> list[str]:
    """Repairs of `repro/knobs/hazards.py` that can run at baseline in `mode` on this provider (a
    repair's cost is what it adds when nothing is wrong). Repairs made in the islands' own code
    (declaring a mutation, issuing on the capture stream) change nothing at baseline: left out."""
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


def parse_batches(spec: str) -> list[int]:
    """`--batches`: decode batch sizes up to PLATFORM_CEILING, the largest size vLLM captures (a
    larger batch runs eagerly there, so its replay time is no serving stack's)."""
    try:
        out = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"--batches {spec!r}: expected comma-separated integers, e.g. 1,8,32") from None
    if not out or any(not 1 <= b <= PLATFORM_CEILING for b in out):
        raise BadInput(f"--batches {spec!r}: batch sizes must be in 1..{PLATFORM_CEILING} (vLLM captures no larger "
                       "decode graph: `default_max_graph_size`)")
    return out


def checkpoint_for(preset: str, device, cache=None) -> Path:
    """The synthetic checkpoint of a preset: the embedded tiny one, or `real-layer` generated once
    (on `device`, into the cache directory)."""
    if preset == "tiny":
        return default_checkpoint(cache)
    if preset not in PRESETS or preset == "qwen3.6-35b-a3b":
        raise BadInput(f"--preset {preset!r}: choose tiny or real-layer (pass a real checkpoint with --model)")
    target = cache_dir(cache) / f"{preset}-seed0"
    if not (target / "config.json").is_file():
        t0 = time.perf_counter()
        make_tiny(target, seed=0, preset=preset, device=torch.device(device))
        print(f"wrote {target} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return target


def run_bench(checkpoint, provider, islands=CHOICES[2:], chain: bool = True, repairs: bool = True,
              batches=(1, 8, 32), modes=MODES, iters: int = 50, warmup: int = 5, seed: int = 0,
              rates: bool = False, log=None, profile: int = 0, lockstep_steps: int = 0,
              hunt_examples: int = 20, reference_every=None, cache=None, spec_tokens: int = 0) -> BenchResult:
    from kernels import registry

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
        res.lockstep_rates = lockstep_rates(model, provider, steps=lockstep_steps, examples=hunt_examples, seed=seed,
                                            log=log, every=reference_every, spec_tokens=spec_tokens)
    if rates:
        res.tiny_rates = tiny_rates(seed=seed, cache=cache)
    return res
