"""`kernels/triton_launch.py`, the launch cache in front of Triton's `kernel[grid](...)`.

Three layers:
- CPU, no triton (CI): `launch_key`'s rules on real CPU tensors, and that equal keys imply equal
  Triton 3.6 specializations (`_spec36`, the rules of 3.6's `native_specialize_impl` written out);
  `import kernels` works without triton.
- CPU with triton 3.6 importable (no GPU: `PYTHONPATH=<a triton 3.6 install>`): the real
  `JITFunction.run` / `Autotuner.run` of 3.6 driven through a stand-in driver and compiler, whose
  compiled kernels record what their launcher is called with. Every cached launch must call the
  kernel Triton picks with the arguments Triton passes (hook slots aside: None for empty chains);
  `_spec36` must agree with the real `native_specialize_impl`.
- GPU (needs CUDA and triton 3.6): every `triton` provider op, fast path against the normal path
  (`REPRO_TRITON_FAST_LAUNCH=0`) bit for bit, outputs and state, over shapes, a changed alignment
  and a changed M; repeat calls hit; nothing cached when disabled; CUDA graph capture replays.
"""
import os
import random

import pytest
import torch

from kernels import triton_launch as TL
from kernels.triton_launch import Unhandled, launch_key

try:
    import triton
    import triton.language as tl
    TRITON36 = triton.__version__.split(".")[:2] == ["3", "6"]
except ImportError:
    TRITON36 = False

RIG = TRITON36 and TL.VERIFIED  # the stand-in driver needs the fast path enabled (not the interpreter)


def _gpu_reason():
    if not torch.cuda.is_available():
        return "needs CUDA and triton 3.6 (no CUDA device)"
    if not TRITON36:
        return "needs CUDA and triton 3.6 (triton 3.6 is not importable)"
    if not TL.VERIFIED:
        return "needs CUDA and triton 3.6 (fast path off: TRITON_INTERPRET=1?)"
    return None


needs_gpu = pytest.mark.skipif(_gpu_reason() is not None, reason=str(_gpu_reason()))
needs_rig = pytest.mark.skipif(not RIG, reason="needs triton 3.6 importable (CPU is enough), not the interpreter")


# ---------------------------------------------------------------- CPU: the key, no triton
def _key(*args, **meta):
    return launch_key(args, meta)


def _spec36(a, constexpr=False):
    """Triton 3.6's specialization of one argument (`native_specialize_impl(backend, a, is_const=False,
    specialize=True, align=True)`, or ("constexpr", a) at a constexpr parameter)."""
    if constexpr:
        return ("constexpr", a)
    if a is None:
        return ("constexpr", None)
    if type(a) is bool:
        return ("u1", None)
    if type(a) is float:
        return ("fp32", None)
    if type(a) is int:
        if a == 1:
            return ("constexpr", 1)
        ty = "i32" if -2 ** 31 <= a < 2 ** 31 else "i64" if -2 ** 63 <= a < 2 ** 63 else "u64"
        return (ty, "D" if a % 16 == 0 else "")
    return ("*" + {torch.float32: "fp32", torch.bfloat16: "bf16", torch.int8: "i8", torch.int32: "i32",
                   torch.int64: "i64", torch.bool: "u1"}[a.dtype], "D" if a.data_ptr() % 16 == 0 else "")


def _pool():
    """CPU tensors of several dtypes at aligned and misaligned offsets, and scalars Triton treats
    specially (1, multiples of 16, the i32 / i64 / u64 edges, negatives, bool vs int)."""
    out = []
    for dt in (torch.float32, torch.bfloat16, torch.int8, torch.int32, torch.int64, torch.bool):
        base = torch.zeros(256, dtype=dt)
        assert base.data_ptr() % 16 == 0
        out += [base, base[1:], base[16:], base[3:]]
    out += [0, 1, 2, 15, 16, 17, 32, -1, -16, -17, 2 ** 31 - 16, 2 ** 31 - 1, 2 ** 31, 2 ** 31 + 16, -2 ** 31,
            -2 ** 31 - 16, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 16, True, False, 1.5, -0.0, 0.0, 1.0, None]
    return out


def test_key_alignment_follows_the_data_pointer():
    x = torch.zeros(64, dtype=torch.bfloat16)
    assert _key(x) == _key(x[8:]) == _key(torch.zeros(3, dtype=torch.bfloat16))  # 16-byte aligned
    assert _key(x[1:]) == _key(x[9:]) != _key(x)                                   # 2 bytes off
    assert _key(x[1:]) != _key(x[8:])
    assert _key(x) != _key(x.float()) and _key(x[1:]) != _key(x.float()[1:])       # dtype
    assert _key(x.view(4, 16)[:, 1:]) == _key(x[1:])                               # shape and strides not keyed


def test_key_ints_bools_floats_none():
    assert _key(16) != _key(32) and _key(16) == _key(16)
    assert _key(1) != _key(True) and _key(0) != _key(False) and _key(True) != _key(False)
    assert _key(1) != _key(1.0) and _key(1.5) == _key(2.5) == _key(-0.0)  # floats: fp32, value not keyed
    assert _key(None) != _key(0) and _key(None) != _key(False)
    assert _key(-16) != _key(16) and _key(2 ** 31) != _key(2 ** 31 - 1)
    assert _key(1, 2) != _key(2, 1) and _key(1) != _key(1, None)


def test_key_meta_by_value_and_type():
    assert _key(BH=64, num_warps=4) == _key(BH=64, num_warps=4)
    assert _key(BH=64, num_warps=4) != _key(BH=64, num_warps=8)
    assert _key(HAS_BIAS=True) != _key(HAS_BIAS=1) and _key(HAS_BIAS=False) != _key(HAS_BIAS=0)
    assert _key(2, BH=3) != _key(2, 3)


def test_key_refuses_unknown_types():
    import numpy as np
    for a in (np.int64(3), [1], (1, 2), "s", object()):
        with pytest.raises(Unhandled):
            _key(a)


def test_equal_keys_mean_equal_triton_specializations():
    """The exactness rule on the pool, pairwise: same key => same Triton 3.6 specialization."""
    pool = _pool()
    for a in pool:
        for b in pool:
            if _key(a) == _key(b):
                assert _spec36(a) == _spec36(b), (a, b)


@pytest.mark.skipif(not TRITON36, reason="needs triton 3.6 importable (CPU is enough)")
def test_the_spec_model_is_triton_36s():
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    for a in _pool():
        assert native_specialize_impl(BaseBackend, a, False, True, True) == _spec36(a), a


@pytest.mark.skipif(not TRITON36, reason="needs triton 3.6 importable (CPU is enough)")
def test_the_host_helpers_equal_tritons():
    """`_np2` / `_cdiv` are Triton's `next_power_of_2` / `cdiv` without their ~4 us host call."""
    import triton

    from kernels.triton_helpers import _cdiv, _np2
    assert all(_np2(n) == triton.next_power_of_2(max(1, n)) for n in range(0, 1 << 17))
    assert all(_cdiv(a, b) == triton.cdiv(a, b) for a in range(0, 3000) for b in (1, 2, 3, 4, 7, 16, 32, 128, 1024))


def test_import_kernels_without_the_fast_path_module(monkeypatch):
    """`import kernels` does not import `kernels.triton_launch` (nor triton); the provider says
    what it says today."""
    import subprocess
    import sys
    code = ("import sys, kernels; from kernels import registry; "
            "assert 'kernels.triton_launch' not in sys.modules; "
            "ok, why = registry.providers('rms_norm')['triton']; print(ok, why)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr
    if not TRITON36 and not torch.cuda.is_available():
        assert r.stdout.startswith("False"), r.stdout


def test_the_module_imports_without_triton_and_stays_off():
    if not TRITON36:
        assert TL.VERIFIED is False


def _python(code, **env):
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                       env={**os.environ, **env})
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_the_switch_is_read_at_import():
    code = "from kernels import triton_launch as TL; print(TL.ENABLED, TL.VERIFIED)"
    assert _python(code, REPRO_TRITON_FAST_LAUNCH="0").split()[0] == "False"
    on, verified = _python(code, REPRO_TRITON_FAST_LAUNCH="1").split()
    assert on == verified == str(RIG)


def test_every_launch_site_goes_through_launch():
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "kernels"
    n = 0
    for p in list(root.glob("*/triton.py")) + [root / "triton_helpers.py"]:
        src = p.read_text()
        assert "_kernel[" not in src, p
        n += src.count("launch(_")
    assert n == 16


# ---------------------------------------------------------------- CPU with triton 3.6: the real launch path
if RIG:
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.driver import driver

    def _plain(x_ptr, y_ptr, n, s, f, FLAG: tl.constexpr, B: tl.constexpr):
        pass

    def _tuned(x_ptr, n, m, B: tl.constexpr, C: tl.constexpr):
        pass

    _GLOBAL = 3

    def _globbed(x_ptr, B: tl.constexpr):
        tl.store(x_ptr, _GLOBAL)  # a global Triton checks at every launch (`used_global_vals`)


class _Rig:
    """Stand-in driver (device 0, a stream number, an sm90 target) and compiler (a real
    CompiledKernel whose launcher, 3.6's real `CudaLauncher` around a recording C launcher,
    records what it is called with) under the real 3.6 launch path. `scratch`: the global scratch
    size of the launchers compiled next."""

    def __init__(self):
        self.calls, self.raw, self.n, self.device, self.stream, self.scratch = [], [], 0, 0, 5000, 0

    def get_current_device(self):
        return self.device

    def get_current_stream(self, device):
        return self.stream + device

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def compile(self, src, target=None, options=None):
        from triton.backends.nvidia.driver import CudaLauncher
        src.hash()  # as `compile` does: computes the function's cache_key (and its used_global_vals)
        ck = CompiledKernel.__new__(CompiledKernel)
        self.n += 1
        ck.module, ck.function, ck.packed_metadata = object(), 1000 + self.n, (options["num_warps"], 1, 0)
        ck.name, ck.src, ck.hash = src.fn.__name__, src, str(self.n)
        run = object.__new__(CudaLauncher)  # its own __call__, a recording C launcher
        run.num_ctas, run.global_scratch_size, run.global_scratch_align = 1, self.scratch, 16
        run.profile_scratch_size, run.profile_scratch_align = 0, 1
        run.launch_cooperative_grid, run.launch_pdl = self.n % 2 == 0, self.n % 3 == 0  # passed through as they are

        def c_launch(gx, gy, gz, stream, function, coop, pdl, scratch, profile, *rest, _ck=ck, _run=run):
            assert (coop, pdl, profile) == (_run.launch_cooperative_grid, _run.launch_pdl, None)
            self.raw.append((_ck, scratch))
            self.calls.append((_ck, gx, gy, gz, stream, function) + rest)
        run.launch = c_launch
        ck._run = run
        return ck

    def jit(self, fn):
        k = triton.jit(fn)
        for dev in (0, 1):
            k.device_caches[dev]
        k.compile = self.compile
        return k


@pytest.fixture
def rig(monkeypatch):
    r = _Rig()
    saved = driver._active
    driver.set_active(r)
    monkeypatch.setattr(TL, "ENABLED", True)
    TL.clear()
    yield r
    driver._active = saved
    TL.clear()


def _same_launch(normal, fast):
    """`fast` (the cache's) calls the kernel Triton's `normal` call used, with the same grid,
    stream, function, metadata and kernel arguments; None for launch metadata and hooks where
    Triton passed its empty hook chains."""
    from triton.knobs import HookChain
    assert fast[0] is normal[0]
    assert fast[1:7] == normal[1:7]
    assert fast[7:10] == (None, None, None)
    assert all(type(h) is HookChain and not h.calls for h in normal[8:10])
    assert len(fast) == len(normal)
    for a, b in zip(fast[10:], normal[10:]):
        if type(b) is torch.Tensor:  # the direct call passes a plain tensor as its address
            assert type(a) is int and a == b.data_ptr(), (a, b)
        else:
            assert a is b or (type(a) is type(b) and a == b and str(a) == str(b)), (a, b)


def _plain_args(rng):
    bufs = [torch.zeros(64, dtype=dt) for dt in (torch.float32, torch.bfloat16, torch.int8)]
    x = rng.choice(bufs)[rng.choice([0, 1, 4, 16])]
    y = rng.choice(bufs)[rng.choice([0, 2, 8, 32]):]
    n = rng.choice([1, 2, 16, 17, 48, -16, 2 ** 31, 2 ** 31 + 16])
    s = rng.choice([0, 1, 3, 64])
    f = rng.choice([1.5, -0.0, 2.0, 1e30])
    return (x if x.dim() else bufs[0], y, n, s, f), dict(FLAG=rng.choice([True, False, 1]), B=rng.choice([16, 32]),
                                                         num_warps=rng.choice([1, 4]))


@needs_rig
def test_cached_launches_are_the_launches_triton_makes(rig, monkeypatch):
    monkeypatch.setattr(TL, "CAP", 10 ** 6)  # the pool has more keys than the cap
    rng = random.Random(0)
    k = rig.jit(_plain)
    for _ in range(300):
        args, meta = _plain_args(rng)
        rig.device = rng.choice([0, 0, 0, 1])
        grid = rng.choice([(3,), (3, 2), (3, 2, 4), lambda meta: (meta["B"], meta["s"] + 1, 2)])
        rig.calls.clear()
        k[grid](*args, **meta)
        TL.launch(k, grid, *args, **meta)
        TL.launch(k, grid, *args, **meta)
        normal, first, fast = rig.calls
        _same_launch(normal, fast)
        assert first[0] is normal[0]
    assert TL.stats["hits"] >= 300 and TL.stats["fills"] >= rig.n > 50  # the key is finer than Triton's


@needs_rig
def test_autotuned_launches_use_the_chosen_config(rig):
    k = rig.jit(_tuned)

    best = {1: 16, 100: 32, 1000: 64, 4096: 32}

    def bench(call, quantiles):  # a timing that depends on the config (B) and the tuning key (n)
        call()
        *_, n, m, B, C = rig.calls[-1]
        return [float(abs(B - best[n]))] * 3
    tuned = triton.autotune([triton.Config({"B": b}, num_warps=w) for b, w in ((16, 2), (32, 4), (64, 8))],
                            key=["n"], do_bench=bench)(k)
    grid = lambda meta: (triton.cdiv(meta["n"], meta["B"]), meta["C"])
    rng = random.Random(1)
    x = torch.zeros(64)
    for _ in range(100):
        n, m, C = rng.choice([1, 100, 1000, 4096]), rng.choice([3, 16]), rng.choice([1, 2])
        xi = x[rng.choice([0, 1])]
        tuned[grid](xi, n, m, C=C)  # tunes on a new n
        rig.calls.clear()
        tuned[grid](xi, n, m, C=C)
        TL.launch(tuned, grid, xi, n, m, C=C)
        TL.launch(tuned, grid, xi, n, m, C=C)
        normal, first, fast = rig.calls
        _same_launch(normal, fast)
        assert tuned.best_config.kwargs["B"] == best[n] and fast[1] == triton.cdiv(n, best[n])
    assert TL.stats["hits"] >= 100


@needs_rig
def test_fallbacks(rig, monkeypatch):
    k = rig.jit(_plain)
    x = torch.zeros(64)
    args = (x, x, 16, 3, 1.5)

    def go(**meta):
        rig.calls.clear()
        h = TL.stats["hits"]
        TL.launch(k, (1,), *args, **{"FLAG": True, "B": 16, **meta})
        TL.launch(k, (1,), *args, **{"FLAG": True, "B": 16, **meta})
        return TL.stats["hits"] - h

    monkeypatch.setattr(TL, "ENABLED", False)  # REPRO_TRITON_FAST_LAUNCH=0 at import
    assert go() == 0 and TL.cached(k) == 0 and len(rig.calls) == 2 and not TL._caches
    monkeypatch.setattr(TL, "ENABLED", True)
    assert go() == 1 and TL.cached(k) == 1
    from triton import knobs
    hook = knobs.runtime.launch_enter_hook
    hook.add(print)
    try:  # a profiler's hook: Triton's own path, which passes it to the launcher (that calls it)
        assert go() == 0 and all(c[8] is hook for c in rig.calls)
    finally:
        hook.remove(print)
    for i, name in ((8, "launch_enter_hook"), (9, "launch_exit_hook")):
        monkeypatch.setattr(knobs.runtime, name, print)  # replaced, not added to
        assert go() == 0 and all(c[i] is print for c in rig.calls)
        monkeypatch.setattr(knobs.runtime, name, None)
        assert go() == 0  # only the default empty chains are known to be no-ops
        monkeypatch.undo()
    monkeypatch.setattr(TL, "ENABLED", True)
    assert go() == 2
    monkeypatch.setattr(TL, "ENABLED", False)
    assert go() == 0 and len(rig.calls) == 2
    monkeypatch.setattr(TL, "ENABLED", True)
    monkeypatch.setattr(knobs.runtime, "debug", True)
    assert go() == 0
    monkeypatch.setattr(knobs.runtime, "debug", False)
    k.add_pre_run_hook(lambda *a, **kw: None)
    assert go() == 0
    k.pre_run_hooks.clear()
    assert go() == 2  # cached before: both hit
    before = TL.cached(k)
    monkeypatch.setattr(TL, "CAP", before)
    assert go(num_warps=2) == 0 and TL.cached(k) == before  # past the cap: normal launches


@needs_rig
def test_refused_fills(rig):
    x = torch.zeros(64)
    k = rig.jit(_plain)
    TL.launch(k, (1,), x, x, 16, 3, 1.5, FLAG=True, B=2.0)   # a float constexpr passed by keyword
    TL.launch(k, (1,), x, x, 16, 3, 1.5, True, B=16)         # FLAG given positionally (bool: allowed)
    assert TL.cached(k) == 1
    TL.launch(k, (1,), x, x, 16, 3, 1.5, 2.5, B=16)          # a float at a constexpr position
    assert TL.cached(k) == 1
    bench = lambda call, quantiles: (call(), [1.0] * 3)[1]
    for kw in (dict(restore_value=["x_ptr"]), dict(reset_to_zero=["x_ptr"]), dict(pre_hook=lambda *a, **k: 0),
               dict(post_hook=lambda *a, **k: 0)):
        t = triton.autotune([triton.Config({"B": 16}), triton.Config({"B": 32})], key=["n"], do_bench=bench,
                            **kw)(rig.jit(_tuned))
        TL.launch(t, (1,), x, 16, 3, C=1)
        assert TL.cached(t) == 0, kw
    t = triton.autotune([triton.Config({"B": 16}, pre_hook=lambda a: None)], key=["n"], do_bench=bench)(rig.jit(_tuned))
    TL.launch(t, (1,), x, 16, 3, C=1)
    assert TL.cached(t) == 0
    t = triton.autotune([triton.Config({"B": 16}), triton.Config({"B": 32})], key=["m"], do_bench=bench)(rig.jit(_tuned))
    TL.launch(t, (1,), x, 16, 2.5, C=1)  # a float tuning key: Triton tunes per value, the key does not see it
    assert TL.cached(t) == 0
    g = rig.jit(_globbed)
    TL.launch(g, (1,), x, B=4)
    TL.launch(g, (1,), x, B=4)
    assert g.used_global_vals and TL.cached(g) == 0 and TL.stats["hits"] == 0


@needs_rig
def test_a_kernel_with_scratch_keeps_tritons_launcher(rig):
    """A launcher that allocates global scratch per launch is called as Triton calls it (its own
    `__call__`, which allocates), never directly: each hit gets a fresh scratch buffer."""
    import triton.runtime._allocation as alloc
    got = []

    class Allocator:  # Triton's allocator protocol: alloc_fn(size, align, stream)
        def __call__(self, size, align, stream):
            got.append((size, align, stream))
            return 7000 + len(got)
    rig.scratch = 32
    k = rig.jit(_plain)
    x = torch.zeros(64)
    token = alloc._allocator.set(Allocator())  # what `triton.set_allocator` does
    try:
        for _ in range(3):
            TL.launch(k, (2, 3), x, x, 16, 3, 1.5, FLAG=True, B=16)
    finally:
        alloc._allocator.reset(token)
    assert TL.cached(k) == 1 and TL.stats["hits"] == 2
    assert [s for _, s in rig.raw] == [7001, 7002, 7003] and got[-1] == (2 * 3 * 32, 16, 5000)
    assert all(type(a) is torch.Tensor for a in rig.calls[-1][10:12])  # Triton's own arguments


def test_a_cpu_tensor_never_shares_a_key_with_a_cuda_one():
    """Cached launches pass addresses, which skip the C launcher's check that a pointer is
    device memory: the key tells a CPU tensor from a CUDA one."""
    x = torch.zeros(64)
    cuda_like = _key(x)
    assert cuda_like[0][2] is False  # CPU tensor
    if torch.cuda.is_available():
        assert _key(x.cuda()) != cuda_like


def _like(a, b):
    """Launcher arguments of two calls agree: tensors (fresh outputs each call) by dtype, shape,
    strides and 16-byte alignment (a cached call's address, `a`, by its alignment: the kernel,
    the same compiled one, fixes the dtype, and shapes and strides are arguments of their own),
    the rest by type and value."""
    if type(b) is torch.Tensor and type(a) is int:
        return a % 16 == b.data_ptr() % 16
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.shape, a.stride(), a.data_ptr() % 16) == (b.dtype, b.shape, b.stride(), b.data_ptr() % 16)
    return type(a) is type(b) and a == b


SITES = {"w8a8_linear": {"_w8a8_rows_kernel", "_w8a8_kernel"},
         "moe": {"_logits_kernel", "_route_kernel", "_moe_up_kernel", "_moe_down_kernel"},
         "rms_norm": {"_rms_norm_kernel"}, "add_rms_norm": {"_add_rms_norm_kernel"},
         "rms_norm_gated": {"_rms_norm_gated_kernel"}, "gdn_gating": {"_gating_kernel"},
         "causal_conv1d_update": {"_conv_update_kernel"}, "causal_conv1d_fn": {"_conv_fn_kernel"},
         "gated_delta_rule_decode": {"_gdn_decode_kernel"}, "gated_delta_rule_prefill": {"_gdn_prefill_kernel"},
         "causal_conv1d_update_spec": {"_conv_spec_kernel"}, "gated_delta_rule_spec": {"_gdn_spec_kernel"}}


def _triton_kernels():
    """op -> (module, function) of each op's `triton` provider, as its folder declares it."""
    from kernels import registry
    return {op: registry.where(op, "triton") for op in registry.ops() if "triton" in registry.providers(op)}


def test_the_sites_are_the_providers():
    assert set(SITES) == set(_triton_kernels()) and sum(map(len, SITES.values())) == 16


@needs_rig
@pytest.mark.parametrize("op", sorted(SITES))
def test_every_call_site_is_cached(op, rig, monkeypatch):
    """The provider functions' real launch sites (CPU tensors, the stand-in compiler; the real
    kernels' caches swapped for fresh ones for the test): the first cached call fills every
    launch, the second hits every one, each with the kernel and arguments of Triton's own path."""
    import collections
    import importlib
    from triton.runtime.autotuner import Autotuner
    from kernels.samples import sample_args
    module, name = _triton_kernels()[op]
    mod = importlib.import_module(module)
    for k in vars(mod).values():
        if type(k) is Autotuner:
            monkeypatch.setattr(k, "cache", {})
            monkeypatch.setitem(k.__dict__, "do_bench", lambda call, quantiles: (call(), [1.0] * 3)[1])
            k = k.fn
        if isinstance(k, triton.runtime.jit.JITFunction):
            monkeypatch.setattr(k, "device_caches", collections.defaultdict(k.create_binder))
            k.device_caches[0]
            monkeypatch.setattr(k, "compile", rig.compile)
    fn = getattr(mod, name)
    seen = set()
    for dims in ({}, dict(T=3), dict(B=3), dict(T=33)):
        args = sample_args(op, device="cpu", seed=2, **dims)
        runs = []
        for on in (False, False, True, True):  # the first tunes (its launches include the benchmark's)
            monkeypatch.setattr(TL, "ENABLED", on)
            rig.calls.clear()
            h, f = TL.stats["hits"], TL.stats["fills"]
            fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
            runs.append((list(rig.calls), TL.stats["hits"] - h, TL.stats["fills"] - f))
        _, (normal, _, _), (first, h1, f1), (second, h2, f2) = runs
        assert len(normal) == len(first) == len(second) > 0
        assert h1 + f1 == len(first) and h2 == len(second) and f2 == 0, (op, dims, h1, f1, h2, f2)
        for n, c in zip(normal, second):
            assert c[0] is n[0] and c[1:7] == n[1:7] and c[7:10] == (None, None, None), (op, dims)
            assert len(c) == len(n) and all(_like(a, b) for a, b in zip(c[10:], n[10:])), (op, dims)
        seen |= {c[0].name for c in second}
    assert seen == SITES[op]


# ---------------------------------------------------------------- GPU: every triton op, fast == normal
OPS = {  # op -> shapes (sample_args dims): two of test_kernels_fast's VARIANTS, then a changed M
    "w8a8_linear": [dict(T=1), dict(T=3), dict(T=33, K=300, N=40)],
    "moe": [dict(T=1), dict(T=5, top_k=3), dict(T=2)],
    "rms_norm": [dict(T=1), dict(T=32, H=2048), dict(T=5)],
    "add_rms_norm": [dict(T=1), dict(T=32, H=2048), dict(T=5)],
    "rms_norm_gated": [dict(T=3), dict(T=32, Hv=32, dv=128), dict(T=7)],
    "gdn_gating": [dict(T=1), dict(T=32, Hv=32), dict(T=5)],
    "causal_conv1d_update": [dict(sentinel=-1), dict(sentinel=0, B=6, S=3), dict(sentinel=0, B=3)],
    "causal_conv1d_fn": [dict(sentinel=-1), dict(sentinel=0, B=6, S=3), dict(sentinel=0, B=3)],
    "gated_delta_rule_decode": [dict(sentinel=-1), dict(sentinel=0, B=6, S=3), dict(sentinel=0, B=3)],
    "gated_delta_rule_prefill": [dict(sentinel=-1), dict(sentinel=0, B=6, S=3), dict(sentinel=0, B=3)],
    "causal_conv1d_update_spec": [dict(sentinel=-1), dict(sentinel=0, B=6, S=3), dict(sentinel=0, B=3, spec_k=4)],
    "gated_delta_rule_spec": [dict(sentinel=-1), dict(sentinel=0, B=6, S=3), dict(sentinel=0, B=3, spec_k=4)],
}


def _copy(t, misalign=False):
    """A copy of contiguous `t` with its storage offset kept, or moved off 16-byte alignment
    (4 bytes off, or 8 for 8-byte types; int8 weights stay whole int32 words)."""
    off = t.storage_offset() + (max(1, 4 // t.element_size()) if misalign else 0)
    buf = torch.empty(off + t.numel(), dtype=t.dtype, device=t.device)
    out = buf[off:].view(t.shape)
    out.copy_(t)
    return out


def _copies(args, misalign=False):
    return [_copy(a, misalign) if isinstance(a, torch.Tensor) else a for a in args]


def _flat(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _call(op, args, monkeypatch, fast):
    from kernels import registry
    monkeypatch.setattr(TL, "ENABLED", fast)
    args = _copies(args)
    with registry.using(**{op: "triton"}):
        out = getattr(torch.ops.repro, op)(*args)
    torch.cuda.synchronize()
    return _flat(out) + [a for a in args if isinstance(a, torch.Tensor)]  # outputs, then every argument after


def _equal(got, want, what):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w), f"{what}: tensor {i} differs"


def _count_launches(monkeypatch):
    """Count the calls of `launch` made by the kernel modules (each imported it by name)."""
    import importlib
    n = [0]
    for module in sorted({m for m, _ in _triton_kernels().values()}):
        mod = importlib.import_module(module)
        real = mod.launch

        def counting(*a, _real=real, **kw):
            n[0] += 1
            return _real(*a, **kw)
        monkeypatch.setattr(mod, "launch", counting)
    return n


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("op", sorted(OPS))
def test_fast_path_is_bit_identical_and_hits(op, monkeypatch):
    from kernels.samples import sample_args
    TL.clear()
    calls = _count_launches(monkeypatch)
    for i, dims in enumerate(OPS[op]):
        for misalign in (False, True):
            what = f"{op} {dims} misaligned={misalign}"
            args = _copies(sample_args(op, device="cuda", seed=10 + i, **dims), misalign)
            want = _call(op, args, monkeypatch, fast=False)
            c, h, f = calls[0], TL.stats["hits"], TL.stats["fills"]
            first = _call(op, args, monkeypatch, fast=True)
            launches = calls[0] - c
            assert launches > 0, what + ": no Triton launch went through kernels.triton_launch"
            assert TL.stats["hits"] - h + TL.stats["fills"] - f == launches, what + ": a launch was not cached"
            c, h = calls[0], TL.stats["hits"]
            second = _call(op, args, monkeypatch, fast=True)
            assert calls[0] - c == launches and TL.stats["hits"] - h == launches, what + ": a repeat launch missed"
            _equal(first, want, what + " (first)")
            _equal(second, want, what + " (repeat)")


@pytest.mark.cuda
@needs_gpu
def test_nothing_cached_when_disabled():
    """REPRO_TRITON_FAST_LAUNCH=0: four ops, twice each, in a fresh process: no hit, no fill."""
    code = """if 1:
        import sys, torch
        from kernels import registry, triton_launch as TL
        from kernels.samples import sample_args
        for op in ("rms_norm", "w8a8_linear", "moe", "gated_delta_rule_decode"):
            args = sample_args(op, device="cuda", seed=4)
            with registry.using(**{op: "triton"}):
                for _ in range(2):
                    getattr(torch.ops.repro, op)(*args)
        torch.cuda.synchronize()
        assert "kernels.moe.triton" in sys.modules and "kernels.norms.triton" in sys.modules
        print(TL.ENABLED, TL.stats["hits"], TL.stats["fills"], len(TL._caches))
    """
    assert _python(code, REPRO_TRITON_FAST_LAUNCH="0") == "False 0 0 0"
    assert _python(code, REPRO_TRITON_FAST_LAUNCH="1").split()[0] == "True"


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("op", sorted(OPS))
def test_graph_capture_replays_the_fast_path(op, monkeypatch):
    """Warm up (fill, then hit) outside the capture; the captured launches are cache hits; replays
    with new inputs equal the normal path's eager results bit for bit."""
    from kernels import registry
    from kernels.samples import sample_args
    fn = getattr(torch.ops.repro, op)
    dims = OPS[op][1]
    first, second = (sample_args(op, device="cuda", seed=s, **dims) for s in (1, 2))
    TL.clear()
    monkeypatch.setattr(TL, "ENABLED", True)
    with registry.using(**{op: "triton"}):
        static = _copies(first)
        fn(*_copies(first))
        fn(*_copies(first))
        torch.cuda.synchronize()
        h = TL.stats["hits"]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(*static)
        assert TL.stats["hits"] > h, "no captured launch came from the cache"
        for args in (first, second, first):
            for s, a in zip(static, args):
                if isinstance(s, torch.Tensor):
                    s.copy_(a)
            graph.replay()
            torch.cuda.synchronize()
            want = _call(op, args, monkeypatch, fast=False)
            monkeypatch.setattr(TL, "ENABLED", True)
            _equal(_flat(out) + [s for s in static if isinstance(s, torch.Tensor)], want, f"{op} replay")
