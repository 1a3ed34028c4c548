"""A real `VllmConfig` from a conformance case, and the GDN layers' `MambaSpec` under it.

`vllm_config` builds the config a serving stack would for the case's checkpoint: `ModelConfig` on
the local folder (no tokenizer, the language model only: a Qwen3.5/3.6 checkpoint otherwise asks
for its vision processor), `CacheConfig` with prefix caching in mode "align" and the case's block
size as both block sizes when it has one, `SchedulerConfig` with the case's sequences and budget,
`CompilationConfig` with the mode and sizes asked for (vLLM's defaults apply where the case has
none), and n-gram speculation with K draft tokens (the drafter does not matter to the control path:
the draft count does). `mamba_spec` is what the GDN layers register
(`vllm/model_executor/layers/mamba/abstract.py: MambaBase.get_kv_cache_spec`), their state shapes
and dtypes from vLLM's own calculators over the checkpoint's text config.
"""
from __future__ import annotations

import copy
import functools

from .case import Case


@functools.lru_cache(maxsize=8)
def _model_config(config_module, path: str, max_model_len: int):
    return config_module.ModelConfig(model=path, skip_tokenizer_init=True, language_model_only=True,
                                     dtype="bfloat16", max_model_len=max_model_len, seed=0)


def model_config(up, case: Case):
    """vLLM's `ModelConfig` for the case's checkpoint folder: a copy of the one built for that folder
    and length (building it parses the checkpoint's config through transformers, 0.15 s)."""
    return copy.deepcopy(_model_config(up.config, str(case.model_path()), case.max_model_len))


def vllm_config(up, case: Case):
    """The `VllmConfig` of the case (module docstring); `up`: `repro.upstream.load.load()`."""
    c = up.config
    cache = {"enable_prefix_caching": case.block_size is not None, "mamba_cache_mode": case.mamba_cache_mode}
    if case.block_size is not None:
        cache.update(block_size=case.block_size, mamba_block_size=case.block_size)
    spec = None
    if case.spec_tokens:
        spec = c.SpeculativeConfig(method="ngram", num_speculative_tokens=case.spec_tokens, prompt_lookup_max=2,
                                   prompt_lookup_min=1)
    sizes = {} if case.sizes is None else {"cudagraph_capture_sizes": list(case.sizes)}
    return c.VllmConfig(
        model_config=model_config(up, case), cache_config=c.CacheConfig(**cache),
        scheduler_config=c.SchedulerConfig(max_num_seqs=case.max_num_seqs,
                                           max_num_batched_tokens=case.max_num_batched_tokens,
                                           max_num_scheduled_tokens=case.max_num_scheduled_tokens,
                                           long_prefill_token_threshold=case.long_prefill_token_threshold,
                                           max_model_len=case.max_model_len, is_encoder_decoder=False),
        compilation_config=c.CompilationConfig(cudagraph_mode=case.graph_mode.name, **sizes),
        speculative_config=spec)


def mamba_spec(up, cfg):
    """The GDN layers' `MambaSpec` under `cfg` (module docstring)."""
    text = cfg.model_config.hf_text_config
    calc = up.mamba_utils
    shapes = calc.MambaStateShapeCalculator.gated_delta_net_state_shape(
        1, text.linear_num_key_heads, text.linear_num_value_heads, text.linear_key_head_dim,
        text.linear_value_head_dim, text.linear_conv_kernel_dim, cfg.num_speculative_tokens)
    dtypes = calc.MambaStateDtypeCalculator.gated_delta_net_state_dtype(
        cfg.model_config.dtype, cfg.cache_config.mamba_cache_dtype, cfg.cache_config.mamba_ssm_cache_dtype)
    return up.kv_cache_interface.MambaSpec(
        shapes=tuple(shapes), dtypes=dtypes, block_size=cfg.cache_config.mamba_block_size,
        mamba_type=up.backend_registry.MambaAttentionBackendEnum.GDN_ATTN, mamba_cache_mode=cfg.cache_config.mamba_cache_mode,
        num_speculative_blocks=cfg.num_speculative_tokens)


def kv_cache_config(up, cfg, num_blocks: int):
    """A `KVCacheConfig` of the model's two kinds of layer, as the engine would hand the scheduler:
    one full-attention group and one GDN (Mamba) group, `num_blocks` blocks. The block size is the
    cache config's (the hybrid model's page-size unification is the allocator's concern, not the
    control path's); no tensors are allocated."""
    kv = up.kv_cache_interface
    text = cfg.model_config.hf_text_config
    attention = kv.FullAttentionSpec(block_size=cfg.cache_config.block_size, num_kv_heads=text.num_key_value_heads,
                                     head_size=text.head_dim, dtype=cfg.model_config.dtype)
    groups = [kv.KVCacheGroupSpec(["attention"], attention), kv.KVCacheGroupSpec(["gdn"], mamba_spec(up, cfg))]
    return kv.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def scheduler(up, cfg, num_blocks: int):
    """vLLM's V1 `Scheduler` (`vllm/v1/core/sched/scheduler.py`) over `kv_cache_config(up, cfg,
    num_blocks)`, built as `EngineCore.__init__` (`vllm/v1/engine/core.py`) builds it: the block
    sizes from `resolve_kv_cache_block_sizes`, the structured-output manager, and `num_gpu_blocks`
    set on the cache config as the engine sets it after profiling. Returns it with the block hasher
    each `Request` it schedules must be made with (`block_hasher`)."""
    cfg.cache_config.num_gpu_blocks = num_blocks
    kv = kv_cache_config(up, cfg, num_blocks)
    block_size, hash_block_size = up.kv_cache_utils.resolve_kv_cache_block_sizes(kv, cfg)
    manager = up.structured_output.StructuredOutputManager(cfg)
    sched = up.scheduler.Scheduler(vllm_config=cfg, kv_cache_config=kv, structured_output_manager=manager,
                                   block_size=block_size, hash_block_size=hash_block_size, log_stats=False)
    return sched, block_hasher(up, cfg, hash_block_size)


def block_hasher(up, cfg, hash_block_size: int):
    """What `Request(..., block_hasher=)` takes, as `EngineCore.__init__` makes it: None without
    prefix caching, else `get_request_block_hasher` over the configured hash function."""
    if not cfg.cache_config.enable_prefix_caching:
        return None
    fn = up.hashing.get_hash_fn_by_name(cfg.cache_config.prefix_caching_hash_algo)
    up.kv_cache_utils.init_none_hash(fn)
    return up.kv_cache_utils.get_request_block_hasher(hash_block_size, fn, *up.block_hasher_args(cfg))
