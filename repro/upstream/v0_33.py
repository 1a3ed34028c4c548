"""vLLM 0.33.0's control classes on a machine without a GPU: every trick this release needs, here and
nowhere else (`v0_26.py` says which of them 0.26.0 shares).

Found by trying, with torch 2.13.0 (CPU) and the pinned list `requirements/vllm-0.33.txt`:

- **Import first, switch after.** The modules are imported under vLLM's unspecified platform, so
  their module-level code takes its non-CUDA branches (e.g. the FP8 linear methods ask `vllm._C`
  for CUTLASS support while their classes are defined); only then `current_platform` becomes a
  `CudaPlatformBase` reporting compute capability 9.0 (an H100), which is what `VllmConfig` needs
  to keep graph capture (the unspecified platform fails "Failed to infer device type", and
  `VLLM_TARGET_DEVICE=cpu` forces `cudagraph_mode=NONE` and no capture sizes). About 200 modules
  bound `current_platform` when imported: each is rebound, and `PIN_MEMORY` (True under the
  unspecified platform, an error on a CPU build of torch) becomes False where a module holds it.
- **`vllm._C_stable_libtorch`** is imported by `vllm/platforms/cuda.py` at module level; the
  wheel's build needs `libcuda.so.1`. An empty module stands in for it (nothing on the control
  path calls into it).
- **torchvision.** `ModelConfig`'s architecture check imports the model's module, which imports
  transformers' Qwen2-VL image processor, which imports torchvision; PyPI's torchvision is a CUDA
  build whose `_C` does not load here, and its fake-kernel registrations then fail with
  `operator torchvision::nms does not exist`. Defining `nms` and `qnms` as a library fragment
  first lets it import. The check runs in a subprocess (`registry._SUBPROCESS_COMMAND`, which
  vLLM documents as the variable to change "if needed"): its command defines the fragment too.

`DRAFT_BOOKKEEPING` names the lines of `GPUModelRunner._prepare_inputs` that compute
`num_decode_draft_tokens`: the runner cannot be built without CUDA streams and its slot-mapping
kernel needs Triton, so `repro.upstream.runner` runs exactly those lines of the installed wheel's
source (cut between the two anchors) rather than a copy of them.
"""
from __future__ import annotations

import importlib
import logging
import sys
import types

VERSION = "0.33.0"

# What the seam uses, imported under the unspecified platform (module docstring), by the name the
# seam's modules use for each.
MODULES = {
    "config": "vllm.config",
    "forward_context": "vllm.forward_context",
    "cudagraph_dispatcher": "vllm.v1.cudagraph_dispatcher",
    "gpu_model_runner": "vllm.v1.worker.gpu_model_runner",
    "backend": "vllm.v1.attention.backend",
    "backend_utils": "vllm.v1.attention.backends.utils",
    "gdn_attn": "vllm.v1.attention.backends.gdn_attn",
    "backend_registry": "vllm.v1.attention.backends.registry",
    "gdn_layer": "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",
    "mamba_utils": "vllm.model_executor.layers.mamba.mamba_utils",
    "gpu_input_batch": "vllm.v1.worker.gpu_input_batch",
    "block_table": "vllm.v1.worker.block_table",
    "kv_cache_interface": "vllm.v1.kv_cache_interface",
    "scheduler": "vllm.v1.core.sched.scheduler",
    "kv_cache_utils": "vllm.v1.core.kv_cache_utils",
    "hashing": "vllm.utils.hashing",
    "scheduler_output": "vllm.v1.core.sched.output",
    "outputs": "vllm.v1.outputs",
    "request": "vllm.v1.request",
    "structured_output": "vllm.v1.structured_output",
    "sampling_params": "vllm.sampling_params",
    "fp8_online": "vllm.model_executor.layers.quantization.online.base",
    "quark": "vllm.model_executor.layers.quantization.quark.quark",
    "model_registry": "vllm.model_executor.models.registry",
}

# The V2 model runner's modules (`vllm/v1/worker/gpu/`), this release's only: `v2.py` drives them.
V2_MODULES = {
    "v2_runner": "vllm.v1.worker.gpu.model_runner",
    "v2_cudagraph": "vllm.v1.worker.gpu.cudagraph_utils",
    "v2_dp": "vllm.v1.worker.gpu.dp_utils",
    "v2_mamba": "vllm.v1.worker.gpu.model_states.mamba_hybrid",
    "worker_utils": "vllm.v1.worker.utils",
    "parallel_state": "vllm.distributed.parallel_state",
}

# torchvision's two ops whose fake kernels its package registers at import (module docstring).
TORCHVISION_FRAGMENT = (
    "import torch\n"
    "_lib = torch.library.Library('torchvision', 'FRAGMENT')\n"
    "_lib.define('nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')\n"
    "_lib.define('qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor')\n"
)

# `GPUModelRunner._prepare_inputs`: the draft bookkeeping runs from the first anchor's line up to
# (not including) the second's.
DRAFT_BOOKKEEPING = ("num_draft_tokens = np.zeros(num_reqs, dtype=np.int32)",
                     "spec_decode_metadata = self._calc_spec_decode_metadata(")


def block_hasher_args(cfg) -> tuple:
    """What `get_request_block_hasher` takes after the hash block size and function, as
    `EngineCore.__init__` passes it (this release: the lookahead tokens)."""
    return (cfg.num_hash_lookahead_tokens,)


def skips_drafts(out) -> bool:
    """Whether the runner proposes no drafts after this `SchedulerOutput` (this release: its
    `skip_drafts`, set when no scheduled request can use them)."""
    return out.skip_drafts


def define_torchvision_ops() -> dict:
    """The fragment, defined in this process; the returned namespace holds the `Library` (dropping
    it would deregister the ops)."""
    scope: dict = {}
    exec(TORCHVISION_FRAGMENT, scope)
    return scope


def model_info_command() -> list[str]:
    """The command vLLM's registry runs to inspect a model class: its own module, after the fragment."""
    return [sys.executable, "-c", TORCHVISION_FRAGMENT +
            "import runpy\nrunpy.run_module('vllm.model_executor.models.registry', run_name='__main__')\n"]


def conformance_platform(cuda, interface):
    """vLLM's CUDA platform as an H100 without a device (`cuda`, `interface`: the modules
    `vllm.platforms.cuda` and `.interface`): capability 9.0, no pinned memory, no NVLink."""
    cap = interface.DeviceCapability

    class ConformancePlatform(cuda.CudaPlatformBase):
        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return cap(major=9, minor=0)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return "conformance (no device)"

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return 80 << 30

        @classmethod
        def is_pin_memory_available(cls) -> bool:
            return False

        @classmethod
        def is_fully_connected(cls, physical_device_ids) -> bool:
            return False

        def get_global_graph_pool(self):
            """No device graph is captured through vLLM here (the suite captures its islands itself):
            the V2 runner's `CudaGraphManager` keeps None as its pool."""
            return None

    return ConformancePlatform()


def switch_platform() -> object:
    """Make `current_platform` the conformance platform in `vllm.platforms` and every loaded vLLM
    module that bound it; `PIN_MEMORY` False wherever a module holds it. Returns the platform."""
    sys.modules.setdefault("vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch"))
    platforms = importlib.import_module("vllm.platforms")
    old = platforms.current_platform
    new = conformance_platform(importlib.import_module("vllm.platforms.cuda"),
                               importlib.import_module("vllm.platforms.interface"))
    platforms.current_platform = new
    for name, mod in list(sys.modules.items()):
        if not name.startswith("vllm") or mod is None:
            continue
        if getattr(mod, "current_platform", None) is old:
            mod.current_platform = new
        if getattr(mod, "PIN_MEMORY", None) is True:
            mod.PIN_MEMORY = False
    return new


def load() -> types.SimpleNamespace:
    """Import the control path and switch the platform (module docstring, in that order); the
    namespace holds each module by its name in `MODULES`, and what must stay alive."""
    keep = define_torchvision_ops()
    mods = {short: importlib.import_module(name) for short, name in {**MODULES, **V2_MODULES}.items()}
    mods["model_registry"]._SUBPROCESS_COMMAND = model_info_command()
    platform = switch_platform()
    logging.getLogger("vllm").setLevel(logging.ERROR)  # its INFO lines would fill a conformance run's output
    return types.SimpleNamespace(version=VERSION, platform=platform, keep=keep, draft_anchors=DRAFT_BOOKKEEPING,
                                 block_hasher_args=block_hasher_args, input_batch_kwargs={}, skips_drafts=skips_drafts,
                                 **mods)
