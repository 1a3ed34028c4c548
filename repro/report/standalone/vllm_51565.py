#!/usr/bin/env python3
"""Standalone reproducer of vLLM #51565 (issue #51562): a request whose first prompt chunk is one
token, placed in a recycled state block, is classed as a decode by the GDN metadata builder
(`split_decodes_and_prefills(m, decode_threshold=1)`: every one-token row is a decode), so the
decode kernels continue from the block's old contents, the state a finished request left there,
instead of starting from zero. No graph is needed: eager runs do it too.

What this script keeps of vLLM (torch only, no vLLM):
- `GDNAttentionMetadataBuilder.build` (`vllm/v1/attention/backends/gdn_attn.py`): 0.26.0 calls a
  one-token row a decode; the fix (vLLM #51565, in 0.33.0) calls it a prefill when it has no prior
  state and is still in its prompt (`no_prior_state & is_prefilling`);
- the decode path loads the row's state unconditionally; the prefill path starts from zero where
  `has_initial_state` is false;
- blocks are not zeroed when a finished request frees them (the recycled block keeps its state).

Run: `python3 vllm_51565.py [--device cpu|cuda] [--repair]`. Exit 1 when the one-token prompt's
output depends on the block's previous owner (the bug reproduces), 0 when it does not, 2 on bad
arguments.
"""
import argparse
import sys

import torch

H, D = 4, 16  # heads and head size of the toy recurrence


def gated_delta_step(S, q, k, v, g, beta):
    """One token of the gated delta rule on S [H, D, D] (fp32)."""
    k = k / (k.norm(dim=-1, keepdim=True) + 1e-6)
    q = q / (q.norm(dim=-1, keepdim=True) + 1e-6) * D ** -0.5
    S = S * torch.exp(g)[:, None, None]
    delta = beta[:, None] * (v - torch.einsum("hd,hde->he", k, S))
    S = S + k[:, :, None] * delta[:, None, :]
    return S, torch.einsum("hd,hde->he", q, S)


def features(ids, device):
    g = torch.Generator().manual_seed(0)
    table = torch.randn(64, 3 * H * D + 2 * H, generator=g)
    x = table[torch.tensor(ids) % 64].to(device)
    q, k, v = x[:, :H * D].view(-1, H, D), x[:, H * D:2 * H * D].view(-1, H, D), x[:, 2 * H * D:3 * H * D].view(-1, H, D)
    return q, k, v, -torch.nn.functional.softplus(x[:, -2 * H:-H]), torch.sigmoid(x[:, -H:])


def is_decode(query_len, num_computed, prompt_len, repair):
    """The builder's class of a one-token row: 0.26.0 by query length alone; the fix also asks
    whether the row has prior state or is past its prompt."""
    if query_len > 1:
        return False
    if not repair:
        return True
    no_prior_state, prefilling = num_computed == 0, num_computed < prompt_len
    return not (no_prior_state and prefilling)


def run(ssm, block, ids, num_computed, prompt_len, repair):
    """One step of one request on state block `block`: the decode path continues the block's state,
    the prefill path starts from zero unless the request has initial state."""
    decode = is_decode(len(ids), num_computed, prompt_len, repair)
    S = ssm[block] if (decode or num_computed > 0) else torch.zeros_like(ssm[block])
    outs = []
    for q, k, v, g, beta in zip(*features(ids, ssm.device)):
        S, o = gated_delta_step(S, q, k, v, g, beta)
        outs.append(o)
    ssm[block] = S
    return torch.stack(outs), decode


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    ap.add_argument("--repair", action="store_true", help="class a one-token first chunk by is_prefilling (vLLM #51565)")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device", file=sys.stderr)
        return 2
    ssm = torch.zeros(4, H, D, D, device=a.device)
    block = 1
    # request A: a 5-token prompt and two decodes in block 1, then it finishes (the block is freed, not zeroed)
    run(ssm, block, [3, 1, 4, 1, 5], 0, 5, a.repair)
    run(ssm, block, [9], 5, 5, a.repair)
    run(ssm, block, [2], 6, 5, a.repair)
    # request B: a one-token prompt, admitted into the recycled block 1
    out, decode = run(ssm, block, [7], 0, 1, a.repair)
    fresh, _ = run(torch.zeros_like(ssm), block, [7], 0, 1, True)
    same = torch.allclose(out, fresh, atol=1e-6)
    print(f"device {a.device}: request B's one-token first chunk was classed a {'decode' if decode else 'prefill'}; "
          f"its output {'equals' if same else 'differs from'} a fresh start (max |d| {float((out - fresh).abs().max()):.3g})")
    if same:
        print("not reproduced: the first chunk started from zero state")
        return 0
    print("REPRODUCED vLLM #51565: a one-token first chunk continued the state a finished request left in its block")
    return 1


if __name__ == "__main__":
    sys.exit(main())
