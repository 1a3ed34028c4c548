"""vLLM 0.26.0's control classes on a machine without a GPU (tried with torch 2.13.0 CPU and
`requirements/vllm-0.26.txt`; the wheel pins torch 2.11, which the control path does not need).

0.26.0 takes 0.33.0's tricks unchanged (`v0_33`: import first, then switch `current_platform` to a
CUDA platform and rebind it and `PIN_MEMORY`; the `_C_stable_libtorch` stand-in; the torchvision
fragment, in the model-inspection subprocess too), over the same modules. What differs here:

- `InputBatch` also takes `kernel_block_sizes` (one per KV cache group; the state group's is its
  block size);
- `get_request_block_hasher` takes no lookahead tokens;
- its `SchedulerOutput` has no `skip_drafts` (the runner always drafts);
- the draft bookkeeping in `GPUModelRunner._prepare_inputs` ends at the same line, and lacks
  0.33.0's zero-draft decode lines (a one-token decode with no drafts stays -1, a non-spec row).
"""
from __future__ import annotations

import importlib
import logging
import types

from . import v0_33

VERSION = "0.26.0"
MODULES = v0_33.MODULES
DRAFT_BOOKKEEPING = v0_33.DRAFT_BOOKKEEPING


def block_hasher_args(cfg) -> tuple:
    """`get_request_block_hasher` takes the hash block size and function only in this release."""
    return ()


def skips_drafts(out) -> bool:
    """This release's `SchedulerOutput` has no `skip_drafts`: the runner always drafts."""
    return False


def load() -> types.SimpleNamespace:
    """As `v0_33.load`, for this release."""
    keep = v0_33.define_torchvision_ops()
    mods = {short: importlib.import_module(name) for short, name in MODULES.items()}
    mods["model_registry"]._SUBPROCESS_COMMAND = v0_33.model_info_command()
    platform = v0_33.switch_platform()
    logging.getLogger("vllm").setLevel(logging.ERROR)
    return types.SimpleNamespace(version=VERSION, platform=platform, keep=keep, draft_anchors=DRAFT_BOOKKEEPING,
                                 block_hasher_args=block_hasher_args, input_batch_kwargs={"kernel_block_sizes": True},
                                 skips_drafts=skips_drafts,
                                 **mods)
