"""The `vllm_xpu` adapters held to the vllm-xpu-kernels wheel they call, on the CPU.

The wheel's own op schemas (`kernels.vllm_xpu_ops.SCHEMAS`, read from vllm-xpu-kernels
0.1.16.2) are registered under test namespaces, with CPU bodies that check what the real kernels
check before they run:
- `_C.gemma_rms_norm`: floating input with a unit last stride; `weight` of the input's dtype (the
  wheel checks it explicitly), contiguous, one value per column; `result` contiguous, the input's
  shape and dtype;
- `_moe_C.topk_softmax` (vllm-xpu-kernels `csrc/moe/topk.cpp`): fp32 `topk_weights` (read with
  `data_ptr<float>`), `topk_indices` int32 / uint32 / int64 (anything else fails a TORCH_CHECK),
  int32 `token_expert_indices`, all three [num_tokens, k]; gating output fp32 / fp16 / bf16,
  contiguous, num_tokens = numel / num_experts; `bias` fp32, `is_padding` bool 1-D [num_tokens];
- `_xpu_C.gdn_attention` (`csrc/xpu/gdn_attn/gdn_attn_interface.cpp` and the kernels it launches):
  contiguous buffers (each block of `conv_state` and `ssm_state`), `projected_states_qkvz` of
  num_k_heads * (2 head_k_dim + 2 head_v_dim * num_v_heads / num_k_heads) columns, `ba` of
  2 num_v_heads, every leading dim >= num_actual_tokens, `conv_weights` and `conv_state` read as
  the inputs' scalar type, `conv_state` blocks [width - 1 (+k), conv elements], `ssm_state` blocks
  [num_v_heads, head_v_dim, head_k_dim], fp32 `A_log`, `dt_bias` of the output's dtype, int32
  index tensors, bool `has_initial_state`, head_k_dim a multiple of the sub-group (32); its body
  then runs `xpu_semantics` on the kernel's own layouts, so an adapter that hands over the suite's
  layouts untransposed, or another argument order, gives other results than `xpu_semantics` run
  directly (the test's check).
The dispatcher checks every call against the schema (argument count, names, types), the bodies
check the rest. The bodies also scribble on the arguments the schema lets them mutate, as a real
kernel may, so an adapter that hands over our op's own inputs is caught.
"""
import pytest
import torch

from kernels._math import tree_sum
from kernels.moe.common import fixed_order_linear
from kernels.moe.vectorized import moe_vectorized
from kernels.moe.vllm_xpu import moe_vllm_xpu
from kernels.norms.reference import rms_norm_reference
from kernels.norms.vllm_xpu import rms_norm_vllm_xpu
from kernels.gdn.vllm_xpu import gdn_attention_vllm_xpu
from kernels.gdn.xpu_semantics import gdn_attention_xpu_semantics
from kernels.samples import gdn_core_args, moe_args
from kernels.vllm_xpu_ops import SCHEMAS, WHEEL_VERSION

PREFIX = "repro_contract"
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
seen_gating: list = []  # gating outputs the topk_softmax body received, for the logits test


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(f"vllm-xpu-kernels {WHEEL_VERSION} contract: {message}")


def gemma_rms_norm(result, input, weight, epsilon):
    _check(input.dtype in FLOATS, f"gemma_rms_norm: input dtype {input.dtype} is not floating")
    _check(weight.dtype == input.dtype, f"gemma_rms_norm: weight dtype {weight.dtype} != input dtype {input.dtype}")
    _check(input.stride(-1) == 1, "gemma_rms_norm: input's last stride must be 1")
    _check(weight.is_contiguous() and weight.numel() == input.shape[-1],
           f"gemma_rms_norm: weight {tuple(weight.shape)} for rows of {input.shape[-1]}")
    _check(result.is_contiguous() and result.shape == input.shape and result.dtype == input.dtype,
           f"gemma_rms_norm: result {tuple(result.shape)} {result.dtype} for input {tuple(input.shape)} {input.dtype}")
    xf = input.float()
    out = xf * torch.rsqrt(tree_sum(xf * xf, -1, keepdim=True) / xf.shape[-1] + epsilon) * (1.0 + weight.float())
    result.copy_(out.to(result.dtype))
    input.fill_(float("nan"))   # the schema marks input and weight mutable: a kernel may use them
    weight.fill_(float("nan"))


def topk_softmax(topk_weights, topk_indices, token_expert_indices, gating_output, renormalize, bias, is_padding):
    E = gating_output.shape[-1]
    _check(gating_output.dtype in FLOATS and gating_output.is_contiguous(),
           f"topk_softmax: gating_output {gating_output.dtype}, contiguous={gating_output.is_contiguous()}")
    T, k = gating_output.numel() // E, topk_weights.shape[-1]
    _check(topk_weights.dtype == torch.float32, f"topk_softmax: topk_weights must be float32, got {topk_weights.dtype}")
    _check(topk_indices.dtype in (torch.int32, torch.uint32, torch.int64),
           f"topk_softmax: topk_indices must be int32, uint32 or int64, got {topk_indices.dtype}")
    _check(token_expert_indices.dtype == torch.int32,
           f"topk_softmax: token_expert_indices must be int32, got {token_expert_indices.dtype}")
    for name, t in (("topk_weights", topk_weights), ("topk_indices", topk_indices),
                    ("token_expert_indices", token_expert_indices)):
        _check(tuple(t.shape) == (T, k) and t.is_contiguous(), f"topk_softmax: {name} {tuple(t.shape)} != {(T, k)}")
    _check(1 <= k <= E, f"topk_softmax: k={k} with {E} experts")
    _check(bias is None or (bias.dtype == torch.float32 and bias.numel() == E), "topk_softmax: bias must be fp32 [E]")
    _check(is_padding is None or (is_padding.dtype == torch.bool and tuple(is_padding.shape) == (T,)),
           "topk_softmax: is_padding must be bool [num_tokens]")
    seen_gating.append(gating_output.clone())
    probs = torch.softmax(gating_output.reshape(T, E).float(), -1)
    vals, ids = torch.sort(probs, dim=-1, descending=True, stable=True)   # ties to the lowest expert
    vals, ids = vals[:, :k], ids[:, :k]
    if renormalize:
        vals = vals / vals.sum(-1, keepdim=True)
    topk_weights.copy_(vals)
    topk_indices.copy_(ids.to(topk_indices.dtype))
    token_expert_indices.copy_(torch.arange(k)[None, :] * T + torch.arange(T)[:, None])


seen_gdn: list = []  # what the gdn_attention body was handed (layouts, flags)


def gdn_attention(core_attn_out, z, projected_states_qkvz, projected_states_ba, num_k_heads, num_v_heads, head_k_dim,
                  head_v_dim, conv_state, ssm_state, conv_weights, conv_bias, activation, A_log, dt_bias, num_prefills,
                  num_decodes, num_spec_decodes, has_initial_state, non_spec_query_start_loc, non_spec_token_indx,
                  non_spec_state_indices_tensor, spec_query_start_loc, spec_token_indx, spec_state_indices_tensor,
                  num_accepted_tokens, num_actual_tokens, tp_size, reorder_input):
    qkvz, ba, n = projected_states_qkvz, projected_states_ba, num_actual_tokens
    Hk, Hv, dk, dv = num_k_heads // tp_size, num_v_heads // tp_size, head_k_dim, head_v_dim
    C, width = 2 * Hk * dk + Hv * dv, conv_weights.shape[-1]
    for name, t in (("core_attn_out", core_attn_out), ("z", z), ("projected_states_qkvz", qkvz),
                    ("projected_states_ba", ba), ("conv_weights", conv_weights), ("A_log", A_log), ("dt_bias", dt_bias),
                    ("conv_state[0]", conv_state[0]), ("ssm_state[0]", ssm_state[0])):
        _check(t.is_contiguous(), f"gdn_attention: {name} must be contiguous")
    _check(qkvz.shape[1] == num_k_heads // tp_size * (2 * dk + 2 * dv * num_v_heads // num_k_heads),
           f"gdn_attention: projected_states_qkvz has {qkvz.shape[1]} columns")
    _check(ba.shape[1] == 2 * Hv, f"gdn_attention: projected_states_ba has {ba.shape[1]} columns")
    _check(core_attn_out.shape[1:] == (Hv, dv) and z.shape[1:] == (Hv, dv), "gdn_attention: core_attn_out / z shape")
    _check(min(t.shape[0] for t in (core_attn_out, z, qkvz, ba)) >= n, "gdn_attention: a leading dim < num_actual_tokens")
    _check(conv_weights.dtype == qkvz.dtype == conv_state.dtype, "gdn_attention: conv_weights and conv_state are read "
           f"as projected_states_qkvz's type ({conv_weights.dtype}, {conv_state.dtype}, {qkvz.dtype})")
    _check(core_attn_out.dtype in (torch.float16, torch.bfloat16), "gdn_attention: core_attn_out must be fp16/bf16")
    _check(A_log.dtype == torch.float32, f"gdn_attention: A_log dtype must be float32, got {A_log.dtype}")
    _check(dt_bias.dtype == core_attn_out.dtype, "gdn_attention: dt_bias dtype must match core_attn_out dtype")
    _check(dk % 32 == 0 and dv % 32 == 0 and Hv % 4 == 0, "gdn_attention: head_k_dim % sub_group_size")
    _check(tuple(conv_weights.shape) == (C, width) and conv_bias is None and activation == "silu",
           "gdn_attention: conv_weights [conv elements, width], no bias, silu")
    _check(conv_state.shape[2] == C and conv_state.shape[1] >= width - 1,
           f"gdn_attention: conv_state {tuple(conv_state.shape)}: blocks of [width - 1 (+k), {C}]")
    _check(ssm_state.shape[1:] == (Hv, dv, dk), f"gdn_attention: ssm_state {tuple(ssm_state.shape)}: blocks of "
           f"[num_v_heads, head_v_dim, head_k_dim] = {(Hv, dv, dk)}")
    for name, t in (("non_spec_query_start_loc", non_spec_query_start_loc), ("non_spec_token_indx", non_spec_token_indx),
                    ("non_spec_state_indices_tensor", non_spec_state_indices_tensor),
                    ("spec_query_start_loc", spec_query_start_loc), ("spec_token_indx", spec_token_indx),
                    ("spec_state_indices_tensor", spec_state_indices_tensor), ("num_accepted_tokens", num_accepted_tokens)):
        _check(t is None or (t.dtype == torch.int32 and t.is_contiguous()), f"gdn_attention: {name} must be of int32 dtype")
    _check(has_initial_state is None or has_initial_state.dtype == torch.bool, "has_initial_state must be of bool dtype")
    _check(reorder_input, "gdn_attention: this body reads the [q | k | v | z] layout (reorder_input=True) only")
    seen_gdn.append({"z_part": qkvz[:, C:].clone(), "has_initial_state": has_initial_state})
    conv, ssm = conv_state.transpose(1, 2).contiguous(), ssm_state.transpose(-1, -2).contiguous()
    gdn_attention_xpu_semantics(core_attn_out, qkvz[:, :C], ba[:, :Hv], ba[:, Hv:], conv_weights, A_log, dt_bias, conv,
                                ssm, num_prefills, num_decodes, num_spec_decodes, n, 0, 0, has_initial_state,
                                non_spec_query_start_loc, non_spec_token_indx, non_spec_state_indices_tensor,
                                spec_query_start_loc, spec_token_indx, spec_state_indices_tensor, num_accepted_tokens, 0)
    conv_state.copy_(conv.transpose(1, 2))
    ssm_state.copy_(ssm.transpose(-1, -2))
    z.fill_(float("nan"))  # the kernel writes z; the adapter must not rely on what


BODIES = {"gemma_rms_norm": gemma_rms_norm, "topk_softmax": topk_softmax, "gdn_attention": gdn_attention}


@pytest.fixture(scope="module")
def ns():
    """library ("_C", "_moe_C") -> the test namespace holding the wheel's schemas."""
    libs, out = [], {}
    for library, schemas in SCHEMAS.items():
        name = PREFIX + library
        lib = torch.library.Library(name, "DEF")
        for op, schema in schemas.items():
            lib.define(schema)
            lib.impl(op, BODIES[op], "CPU")
        libs.append(lib)
        out[library] = getattr(torch.ops, name)
    yield out
    for lib in libs:
        lib._destroy()


def test_every_schema_kept_has_a_checking_body():
    assert {op for schemas in SCHEMAS.values() for op in schemas} == set(BODIES)
    for library, schemas in SCHEMAS.items():
        for op, schema in schemas.items():
            assert torch._C.parse_schema(schema).name == op, (library, op)


@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float32])
def test_rms_norm_adapter_meets_the_contract(ns, w_dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 64, generator=g).to(torch.bfloat16)
    w = (torch.randn(64, generator=g) * 0.1).to(w_dtype)
    x0, w0 = x.clone(), w.clone()
    out = rms_norm_vllm_xpu(x, w, 1e-6, ns=ns["_C"])
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.equal(x, x0) and torch.equal(w, w0)  # the body scribbled on copies only
    expected = rms_norm_reference(x, w.to(x.dtype), 1e-6)
    torch.testing.assert_close(out, expected, rtol=2 ** -7, atol=1e-6)


def _uncast_rms_norm(x, w, eps, ns):
    """An adapter that passes the weight in its own dtype, uncast: what the contract must refuse."""
    flat = x.reshape(-1, x.shape[-1]).contiguous().clone()
    out = torch.empty_like(flat)
    ns.gemma_rms_norm(out, flat, w.contiguous().clone(), eps)
    return out.view(x.shape)


def test_contract_catches_the_uncast_weight(ns):
    x = torch.randn(4, 64).to(torch.bfloat16)
    w = torch.zeros(64, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="weight dtype torch.float32 != input dtype torch.bfloat16"):
        _uncast_rms_norm(x, w, 1e-6, ns["_C"])
    _uncast_rms_norm(x, w.to(x.dtype), 1e-6, ns["_C"])  # the same call is fine when the dtypes agree


def test_contract_catches_calls_that_do_not_fit_the_schema(ns):
    T, k, E = 3, 2, 8
    logits = torch.randn(T, E).to(torch.bfloat16)
    w, ids, te = torch.empty(T, k), torch.empty(T, k, dtype=torch.int32), torch.empty(T, k, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="renormalize"):  # the older four-argument form
        ns["_moe_C"].topk_softmax(w, ids, te, logits)
    with pytest.raises(RuntimeError, match="token_expert_indices must be int32"):
        ns["_moe_C"].topk_softmax(w, ids, te.long(), logits, True, None, None)
    with pytest.raises(RuntimeError, match="topk_weights must be float32"):
        ns["_moe_C"].topk_softmax(w.bfloat16(), ids, te, logits, True, None, None)
    with pytest.raises(RuntimeError, match="topk_indices"):
        ns["_moe_C"].topk_softmax(w, ids.to(torch.int16), te, logits, True, None, None)
    with pytest.raises(RuntimeError, match="gemma_rms_norm"):  # result and input swapped in dtype
        ns["_C"].gemma_rms_norm(torch.empty(T, E), logits, torch.zeros(E, dtype=torch.bfloat16), 1e-6)


@pytest.mark.parametrize("x_dtype, router_dtype", [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                                    (torch.float32, torch.float32)])
def test_moe_adapter_meets_the_contract_with_fixed_order_logits(ns, x_dtype, router_dtype):
    """fp32 activations tell the fixed-order sums from a library GEMM (in bf16 both round alike)."""
    args = list(moe_args(torch.Generator().manual_seed(1), T=5, H=64, E=8, I=32, Is=32, top_k=2, quantized=True))
    args[0] = args[0].to(x_dtype)
    args[1] = args[1].to(router_dtype)  # the adapter takes the router weight in any dtype (fixed-order logits)
    seen_gating.clear()
    out = moe_vllm_xpu(*args, ns=ns["_moe_C"])
    x, router_w = args[0], args[1]
    # the logits the kernel received are the fixed-order ones every provider uses
    assert len(seen_gating) == 1 and torch.equal(seen_gating[0], fixed_order_linear(x, router_w))
    expected = moe_vectorized(*args)
    torch.testing.assert_close(out, expected, rtol=2 ** -7, atol=1e-3)


def test_moe_adapter_rows_do_not_depend_on_the_batch(ns):
    args = list(moe_args(torch.Generator().manual_seed(2), T=9, H=64, E=8, I=32, Is=32, top_k=2, quantized=True))
    full = moe_vllm_xpu(*args, ns=ns["_moe_C"])
    part = moe_vllm_xpu(*([args[0][:3]] + args[1:]), ns=ns["_moe_C"])
    assert torch.equal(full[:3], part)


LOADER = '''import torch
from kernels.vllm_xpu_ops import SCHEMAS

lib = torch.library.Library("{name}", "DEF")
lib.define(SCHEMAS["_C"]["gemma_rms_norm"])


def body(result, input, weight, epsilon):
    result.copy_((input.float() * (1.0 + weight.float())).to(result.dtype))


lib.impl("gemma_rms_norm", body, "CPU")
'''


def test_wheel_calls_are_kernel_calls_and_their_script_finds_the_op(ns, tmp_path):
    """The adapters call the wheel through `registry.call`: each
    call is recorded with inputs that repeat (no uninitialised output buffer), and a kernel
    report's script loads the op's library and finds the op by its `torch.ops` name. Here the
    library is a test one, registered by a module the script imports (as it would import
    `vllm_xpu_kernels._C`)."""
    import os
    import subprocess
    import sys

    from kernels import registry
    from repro.check.kernelcase import KernelCase, write_kernel_script
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    w = torch.zeros(64, dtype=torch.bfloat16)
    runs = []
    for _ in range(2):
        with registry.recording() as calls:
            rms_norm_vllm_xpu(x, w, 1e-6, ns=ns["_C"])
            moe_vllm_xpu(*moe_args(torch.Generator().manual_seed(1), T=5, H=64, E=8, I=32, Is=32, top_k=2,
                                   quantized=True),
                         ns=ns["_moe_C"])
        runs.append(calls)
    assert [c.name for c in runs[0]] == [f"torch.ops.{PREFIX}_C.gemma_rms_norm",
                                         f"torch.ops.{PREFIX}_moe_C.topk_softmax"]
    for a, b in zip(*runs):  # the same inputs, output buffers included, on both runs
        assert all(torch.equal(u, v) for u, v in zip(a.args, b.args) if isinstance(u, torch.Tensor))

    loader = f"{PREFIX}_loader"
    (tmp_path / f"{loader}.py").write_text(LOADER.format(name=f"{PREFIX}_script"))
    registry.op_library(f"{PREFIX}_script", loader)
    sys.path.insert(0, str(tmp_path))
    try:
        import importlib
        importlib.import_module(loader)
        op = getattr(torch.ops, f"{PREFIX}_script").gemma_rms_norm
        with registry.recording() as calls:
            registry.call(op, torch.zeros(2, 64, dtype=torch.bfloat16), x[:2].clone(), w, 1e-6)
    finally:
        sys.path.remove(str(tmp_path))
    case = KernelCase("nondeterminism", 0, calls[0], calls[0], 0.0)
    assert write_kernel_script(case, tmp_path, "test") == ["kernel_inputs.pt", "repro_kernel.py"]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), root])}
    r = subprocess.run([sys.executable, "repro_kernel.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]  # found, loaded and called; a repeatable body: no effect
    assert r.stdout.startswith(f"torch.ops.{PREFIX}_script.gemma_rms_norm: nondeterminism"), r.stdout


GDN_DIMS = dict(Hk=2, Hv=4, dk=32, dv=64, S=7)  # the kernel's constraints; dk != dv, so a transposed state shows
GDN_BATCHES = {
    "padded decode": dict(T=4, num_decodes=4, num_actual_tokens=4, non_spec_query_start_loc=[0, 1, 2, 2, 2],
                          non_spec_state_indices=[3, 5, 0, 0]),
    "decode and prefill": dict(T=6, num_decodes=1, num_prefills=2, num_actual_tokens=6, num_decode_tokens=1,
                               num_prefill_tokens=5, non_spec_query_start_loc=[0, 1, 3, 6],
                               non_spec_state_indices=[2, 4, 6], has_initial_state=[True, True, False]),
    "spec": dict(T=6, spec_k=2, num_spec_decodes=2, num_actual_tokens=6, spec_query_start_loc=[0, 3, 6],
                 spec_state_indices=[[1, 2, 3], [4, 5, 6]], num_accepted_tokens=[2, 1], spec_token_indx=list(range(6))),
    "spec beside a prefill": dict(T=6, spec_k=1, num_spec_decodes=1, num_prefills=1, num_actual_tokens=6,
                                  num_prefill_tokens=4, spec_query_start_loc=[0, 2], spec_state_indices=[[5, 6]],
                                  num_accepted_tokens=[1], spec_token_indx=[0, 1], non_spec_token_indx=[2, 3, 4, 5],
                                  non_spec_query_start_loc=[0, 4], non_spec_state_indices=[2], has_initial_state=[True]),
}


def _gdn_args(batch):
    return gdn_core_args(seed=3, **GDN_DIMS, **GDN_BATCHES[batch])


@pytest.mark.parametrize("batch", list(GDN_BATCHES))
def test_gdn_attention_adapter_meets_the_contract(ns, batch):
    """The adapter through the wheel's schema and the kernel's layouts == `xpu_semantics` on the
    suite's layouts, outputs and both states bit for bit; z goes in as zeros."""
    direct, adapted = _gdn_args(batch), _gdn_args(batch)
    gdn_attention_xpu_semantics(*direct)
    seen_gdn.clear()
    gdn_attention_vllm_xpu(*adapted, ns=ns["_xpu_C"])
    for i in (0, 7, 8):  # core_out, conv_state, ssm_state
        assert torch.equal(direct[i], adapted[i]), (batch, i)
    assert len(seen_gdn) == 1 and not seen_gdn[0]["z_part"].any()


def test_contract_catches_an_adapter_that_keeps_the_suites_layouts(ns):
    args = list(_gdn_args("padded decode"))
    core, qkv, b, a, w, A_log, dt_bias, conv, ssm = args[:9]
    meta = args[9:]
    qkvz = torch.cat([qkv, torch.zeros(qkv.shape[0], 4 * 64, dtype=qkv.dtype)], 1)
    z, ba = torch.zeros_like(core), torch.cat([b, a], 1)
    i32 = [m.int() if isinstance(m, torch.Tensor) else m for m in meta]
    nd, qsl, idx, n = i32[1], i32[7], i32[9], i32[3]

    def call(conv_state, ssm_state, a_log, qsl_, idx_):
        ns["_xpu_C"].gdn_attention(core, z, qkvz, ba, 2, 4, 32, 64, conv_state, ssm_state, w, None, "silu", a_log,
                                   dt_bias, 0, nd, 0, None, qsl_, None, idx_, None, None, None, None, n, 1, True)
    kernel_conv, kernel_ssm = conv.transpose(1, 2).contiguous(), ssm.transpose(-1, -2).contiguous()
    with pytest.raises(RuntimeError, match="ssm_state .*blocks of"):
        call(kernel_conv, ssm, A_log.float(), qsl, idx)                  # the state not transposed
    with pytest.raises(RuntimeError, match="conv_state .*blocks of"):
        call(conv, kernel_ssm, A_log.float(), qsl, idx)                  # the conv state not transposed
    with pytest.raises(RuntimeError, match="A_log dtype must be float32"):
        call(kernel_conv, kernel_ssm, A_log, qsl, idx)
    with pytest.raises(RuntimeError, match="non_spec_state_indices_tensor must be of int32"):
        call(kernel_conv, kernel_ssm, A_log.float(), qsl, idx.long())
    with pytest.raises(RuntimeError, match="num_prefills"):  # the schema's argument order: an int where a tensor goes
        ns["_xpu_C"].gdn_attention(core, z, qkvz, ba, 2, 4, 32, 64, kernel_conv, kernel_ssm, w, None, "silu",
                                   A_log.float(), dt_bias, qsl, 0, 0, None, qsl, None, idx, None, None, None, None, n, 1,
                                   True)
    call(kernel_conv, kernel_ssm, A_log.float(), qsl, idx)               # the same call in the kernel's layouts runs
