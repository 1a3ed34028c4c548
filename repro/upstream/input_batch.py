"""vLLM's persistent batch and its block table (`vllm/v1/worker/gpu_input_batch.py: InputBatch`,
`vllm/v1/worker/block_table.py: BlockTable`) behind the mirror's calls
(`repro.control.input_batch.InputBatch`: `add`, `remove`, `condense`, `commit`, `table`,
`committed`, `row_of`).

Built as `GPUModelRunner.may_reinitialize_input_batch` builds it, for the GDN layers' KV cache group
alone (the mirror keeps that group's table): its block size, `MambaSpec.max_num_blocks_per_req`
columns, no slot mapping (`SlotMappingMode.NONE`, a state group's), `max_num_seqs` rows, on the
CPU (the "device" copy is then a second CPU tensor, so `commit` still copies). A request is a
`CachedRequestState` with a greedy sampling parameter and the request's state blocks as its one
group's block ids; `condense` is followed by `refresh_metadata`, as `_update_states` follows it.
"""
from __future__ import annotations

import numpy as np
import torch

from .config import mamba_spec


class InputBatch:
    """One runner's `InputBatch` for the state group (module docstring)."""

    def __init__(self, up, cfg):
        self.up, self.cfg = up, cfg
        spec = mamba_spec(up, cfg)
        mm = cfg.model_config.max_model_len
        kwargs = dict(max_num_reqs=cfg.scheduler_config.max_num_seqs, max_model_len=mm,
                      max_num_batched_tokens=cfg.scheduler_config.max_num_batched_tokens, device=torch.device("cpu"),
                      vocab_size=cfg.model_config.get_vocab_size(), block_sizes=[spec.block_size],
                      max_num_blocks_per_req=[spec.max_num_blocks_per_req(cfg, mm)],
                      num_spec_tokens=cfg.num_speculative_tokens,
                      slot_mapping_modes=[up.block_table.SlotMappingMode.NONE])
        if "kernel_block_sizes" in up.input_batch_kwargs:
            kwargs["kernel_block_sizes"] = [spec.block_size]
        self.batch = up.gpu_input_batch.InputBatch(**kwargs)
        self.blocks = self.batch.block_table[0]

    @property
    def width(self) -> int:
        return self.blocks.block_table.np.shape[1]

    @property
    def table(self) -> np.ndarray:
        """The host block table (`BlockTable.block_table.np`)."""
        return self.blocks.block_table.np

    @property
    def committed(self) -> np.ndarray:
        """What the device reads (`BlockTable.block_table.gpu`, a CPU tensor here)."""
        return self.blocks.block_table.gpu.numpy()

    @property
    def row_of(self) -> dict[int, int]:
        return {int(r): i for r, i in self.batch.req_id_to_index.items()}

    def add(self, rid: int, blocks) -> None:
        """`InputBatch.add_request` of a request holding `blocks`."""
        sp = self.up.sampling_params.SamplingParams(temperature=0.0)
        req = self.up.gpu_input_batch.CachedRequestState(
            req_id=str(rid), prompt_token_ids=[0], mm_features=[], sampling_params=sp, generator=None,
            block_ids=([int(b) for b in blocks],), num_computed_tokens=0, output_token_ids=[])
        self.batch.add_request(req)

    def remove(self, rid: int) -> None:
        """`InputBatch.remove_request`."""
        self.batch.remove_request(str(rid))

    def condense(self) -> None:
        """`InputBatch.condense`, then `refresh_metadata`."""
        self.batch.condense()
        self.batch.refresh_metadata()

    def commit(self, n: int) -> None:
        """`BlockTable.commit_block_table(n)`."""
        self.blocks.commit_block_table(n)

    def move_row(self, src: int, tgt: int) -> None:
        """`BlockTable.move_row`."""
        self.blocks.move_row(src, tgt)

    def clear_row(self, row: int) -> None:
        """`BlockTable.clear_row`."""
        self.blocks.clear_row(row)

    def append_row(self, blocks, row: int) -> None:
        """`BlockTable.append_row`: more blocks at the end of a row."""
        self.blocks.append_row([int(b) for b in blocks], row)
