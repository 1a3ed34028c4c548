"""`launch(kernel, grid, *args, **meta)`: `kernel[grid](*args, **meta)` that, on a repeat call,
skips Triton's Python launch path and calls the compiled kernel's C launcher directly (on an
H200, ~16 us of host per `kernel[grid]` launch, ~6.6 us for the launcher itself).

The first call for a key takes the normal path (compiling / autotuning as before) and keeps what it
returns, the `CompiledKernel` (for an `Autotuner`, with its `best_config`), under the key. A later
call with the same key evaluates the grid and calls `compiled.run(...)` with the arguments Triton
itself passes, or, when `compiled.run` is 3.6's `CudaLauncher` with no scratch to allocate, its C
launcher directly with what `CudaLauncher.__call__` would pass it, each plain tensor as its data
pointer (the key read it already). Verified against the Triton 3.6.0 source only; anywhere else it
is the normal path.

What Triton 3.6 does (the facts this rests on):
- `JITFunction.run`: `device = driver.active.get_current_device()`, `stream =
  driver.active.get_current_stream(device)`; runs `self.pre_run_hooks`; the binder
  (`create_function_from_signature`) returns `bound_args` (every parameter by name in signature
  order, constexprs included, defaults applied), `specialization` (one entry per parameter) and
  `options` (the keywords that are not parameters, plus `debug` = `kwargs.get("debug", self.debug)
  or knobs.runtime.debug` and `instrumentation_mode` = `knobs.compilation.instrumentation_mode`);
  `compute_cache_key(specialization, options)` picks the kernel in `self.device_caches[device]`.
  It then checks `self.used_global_vals`, evaluates a callable grid as `grid(bound_args)` (missing
  dimensions 1) and calls `kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata,
  kernel.launch_metadata(grid, stream, *bound_args.values()), knobs.runtime.launch_enter_hook,
  knobs.runtime.launch_exit_hook, *bound_args.values())`.
- `native_specialize_impl` (C++ `specialize.cc`; its rules checked against the 3.6.0 wheel's
  `libtriton` by tests/test_triton_launch.py): a constexpr parameter is ("constexpr", value); an int
  (exact type) ("constexpr", 1) when == 1, else i32 / i64 / u64 by range with "D" when value & 15
  == 0; a bool u1; a float fp32 (value not read); None ("constexpr", None); a torch.Tensor (or
  anything with `data_ptr`) its dtype (with the parameter's static const-ness) and "D" when
  `data_ptr() & 15 == 0` (`supports_native_tensor_specialization` on CUDA). Devices, shapes and
  strides are not read; `do_not_specialize(_on_alignment)` only drops information.
- `Autotuner.run`: the config is `self.cache[key]`, key = the values of the `key=` arguments plus
  `str(dtype)` of every argument that has one (tuned once per key), or `configs[0]` if there is
  one; it calls `config.pre_hook` if set, then `self.fn.run(*args, **kwargs,
  **config.all_kwargs())` (the config's kwargs, num_warps, num_ctas, num_stages, and maxnreg /
  ir_override when set). `pre_hook`, `post_hook`, `reset_to_zero`, `restore_value`: tuning only.
- `CompiledKernel.launch_metadata` is None when `launch_enter_hook` is None, else lazy, no side
  effect; the launcher (`make_launcher`, backends/nvidia/driver.py) calls the enter / exit hooks
  only when not None, parses every parameter (constexprs as unused objects), and
  `CudaLauncher.__call__` allocates the kernel's scratch itself. Both hooks default to empty
  `knobs.HookChain`s, whose call does nothing: passing None for the metadata and both hooks is the
  same launch.
- `CudaLauncher.__call__(gx, gy, gz, stream, function, *rest)`: scratch buffers from its
  allocators when `global_scratch_size` / `profile_scratch_size` > 0 (else None), then
  `self.launch(gx, gy, gz, stream, function, launch_cooperative_grid, launch_pdl, global_scratch,
  profile_scratch, *rest)`, `self.launch` being the compiled C launcher (wrapped only for tensor
  descriptor parameters, none here). The C launcher's `getPointer` takes a Python int as the
  address itself; for any other object it calls `data_ptr()` and checks the address with
  `cuPointerGetAttribute` (a CPU tensor fails there): per tensor, a Python call and a driver call
  that the direct call saves (the copies' host path is most of a checked step). The key
  holds `is_cuda` for every tensor, so a CPU tensor never reaches a cached entry.

Why the key is exact: `launch_key` keys a positional int by its value (fixing == 1, & 15 and the
range), a bool as (bool, value) (True == 1 in Python, not in Triton), a float as fp32 (its value
is passed on, as Triton passes it; a float at a constexpr position is refused at the fill), None
as None, a tensor by (dtype, data_ptr() % 16 == 0, is_cuda); other types raise `Unhandled` (normal path).
`meta` is keyed by its (name, value) pairs and their types: every constexpr, num_warps, num_stages
by value. With the current device in the key, and debug / instrumentation_mode at their defaults
(else normal path), equal keys give Triton the same specialization and options, so the same
compiled kernel; for an `Autotuner` also the same tuning key (the fill requires its `key=`
arguments to be ints, bools, str or None, keyed by value), so the same config. The launcher gets
`args` as given plus the stored values of the parameters given by keyword or by the config, which
the fill requires to be ints, bools, str or None: fixed by the key.

Normal path, never cached: Triton not 3.6.x; `TRITON_INTERPRET=1` at import; env
`REPRO_TRITON_FAST_LAUNCH=0` at import (`ENABLED`); `knobs.runtime.debug` or
`knobs.compilation.instrumentation_mode` set; a launch enter / exit hook that is not 3.6's default
empty chain (a profiler's); a kernel that is not a `JITFunction` or an `Autotuner` of one (exact
types: not the interpreter's, not `Heuristics`); `pre_run_hooks` or `used_global_vals` on it; an
`Autotuner` with pre_hook, post_hook, reset_to_zero, restore_value or a config pre_hook, or a
`key=` argument not keyed by value; an argument of another type; a float, tensor or other value in
`meta` or at a constexpr position; a parameter left to its default; a non-CUDA target; a launch
that did not return a `CompiledKernel`; new keys past `CAP` per kernel. Not reproduced on a
cached launch: `Autotuner.best_config` is not updated; if Triton's own caches are cleared later,
this one stays on the kernel Triton chose before.
"""
from __future__ import annotations

import os

import torch

try:
    import triton
    VERIFIED = triton.__version__.split(".")[:2] == ["3", "6"] and os.environ.get("TRITON_INTERPRET") != "1"
except ImportError:  # CPU CI: no triton; `launch_key` still works
    VERIFIED = False

if VERIFIED:
    from triton import knobs
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.driver import driver
    try:
        from triton.backends.nvidia.driver import CudaLauncher
    except ImportError:  # a wheel without the NVIDIA backend: never the direct call
        CudaLauncher = None
    from triton.runtime.jit import JITFunction
    _ENTER, _EXIT = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook  # 3.6's default empty chains

ENV = "REPRO_TRITON_FAST_LAUNCH"
ENABLED = VERIFIED and os.environ.get(ENV) != "0"  # read once, at import (tests set it directly)
CAP = 64  # keys per kernel
stats = {"hits": 0, "fills": 0}
_caches: dict[int, tuple[object, dict]] = {}  # id(kernel) -> (kernel, {(device, key): entry}); holds the kernel
_BY_VALUE = (int, bool, str, type(None))
_Tensor = torch.Tensor


class Unhandled(TypeError):
    """An argument of a type `launch_key` does not key."""


def _scalar(a):
    t = type(a)
    if t is bool:
        return (bool, a)
    if a is None:
        return None
    if isinstance(a, _Tensor):  # a subclass (nn.Parameter): Triton reads it as a tensor too
        return (a.dtype, a.data_ptr() % 16 == 0, a.is_cuda)
    raise Unhandled(t.__name__)


def launch_key(args, meta) -> tuple:
    """The key of a launch's positional `args` and keyword `meta` (see the module docstring): one
    entry per positional argument (never a (str, ...) pair), then meta's (name, value) pairs, then
    their types."""
    return _key(args, [a.data_ptr() if type(a) is _Tensor else a for a in args], meta)


def _key(args, ptrs, meta) -> tuple:
    """`launch_key`, given `ptrs`: `args` with every plain tensor replaced by its data pointer."""
    k = [p if (t := type(a)) is int else (a.dtype, p % 16 == 0, a.is_cuda) if t is _Tensor else
         float if t is float else _scalar(a) for a, p in zip(args, ptrs)]
    k += meta.items()
    k += map(type, meta.values())
    return tuple(k)


def launch(kernel, grid, *args, **meta):
    """`kernel[grid](*args, **meta)`, through the cache when it applies; returns the CompiledKernel."""
    slot = _caches.get(id(kernel))
    if slot is None:
        if not ENABLED or type(kernel) not in (JITFunction, Autotuner):
            return kernel[grid](*args, **meta)
        slot = _caches[id(kernel)] = (kernel, {})
    rt = knobs.runtime
    if not ENABLED or rt.debug or knobs.compilation.instrumentation_mode or rt.launch_enter_hook is not _ENTER or \
            _ENTER.calls or rt.launch_exit_hook is not _EXIT or _EXIT.calls:  # a hook set: a profiler's
        return kernel[grid](*args, **meta)
    drv = driver.active
    device = drv.get_current_device()
    try:
        ptrs = [a.data_ptr() if type(a) is _Tensor else a for a in args]
        key = (device, _key(args, ptrs, meta))
        hit = slot[1].get(key)
    except Exception:  # an unhandled argument type, an unhashable meta value
        return kernel[grid](*args, **meta)
    if hit is None:
        compiled = kernel[grid](*args, **meta)
        _fill(kernel, slot[1], key, args, meta, compiled)
        return compiled
    compiled, run, fn, names, tail, direct = hit
    if fn.pre_run_hooks:
        return kernel[grid](*args, **meta)
    if callable(grid):
        grid = grid(dict(zip(names, args + tail)))
    n = len(grid)
    g1, g2, stream = grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, drv.get_current_stream(device)
    if direct is None:
        run(grid[0], g1, g2, stream, compiled.function, compiled.packed_metadata, None, None, None, *args, *tail)
    else:  # what `CudaLauncher.__call__` passes its C launcher, tensors as their data pointers
        direct[0](grid[0], g1, g2, stream, compiled.function, direct[1], direct[2], None, None,
                  compiled.packed_metadata, None, None, None, *ptrs, *tail)
    stats["hits"] += 1
    return compiled


def _fill(kernel, cache, key, args, meta, compiled) -> None:
    """Keep `compiled` under `key` when every condition of the module docstring holds."""
    if type(compiled) is not CompiledKernel:
        return
    fn, full_meta = kernel, meta
    if type(kernel) is Autotuner:
        fn, cfg = kernel.fn, kernel.best_config
        named = {**dict(zip(fn.arg_names, args)), **meta}
        if kernel.user_defined_pre_hook or kernel.user_defined_post_hook or kernel.reset_to_zero or \
                kernel.restore_value or cfg.pre_hook is not None or \
                any(type(named[k]) not in _BY_VALUE for k in kernel.keys if k in named):
            return
        full_meta = {**meta, **cfg.all_kwargs()}
    if type(fn) is not JITFunction or fn.pre_run_hooks or fn.used_global_vals or \
            any(type(v) not in _BY_VALUE for v in full_meta.values()) or \
            any(p.is_constexpr and type(args[p.num]) not in _BY_VALUE for p in fn.params[:len(args)]) or \
            any(n not in full_meta for n in fn.arg_names[len(args):]) or \
            driver.active.get_current_target().backend != "cuda":
        return
    if len(cache) < CAP:
        run = compiled.run
        direct = None
        if type(run) is CudaLauncher and not run.global_scratch_size and not run.profile_scratch_size:
            direct = (run.launch, run.launch_cooperative_grid, run.launch_pdl)
        cache[key] = (compiled, run, fn, fn.arg_names, tuple(full_meta[n] for n in fn.arg_names[len(args):]), direct)
        stats["fills"] += 1


def clear() -> None:
    """Forget every cached launch (tests)."""
    _caches.clear()
    stats.update(hits=0, fills=0)


def cached(kernel) -> int:
    """How many keys `kernel` has in the cache."""
    slot = _caches.get(id(kernel))
    return len(slot[1]) if slot else 0
