#!/usr/bin/env python3
"""Standalone reproducer of vLLM #53051 (also #49918): with speculative decoding (k draft tokens a
decode), a prefill chunk of exactly 1+k tokens is called a uniform decode by its shape alone and
replayed through the FULL decode graph, whose GDN metadata the builder stages only for batches
without a prefill. The replay reads the state indices the buffers hold from capture (the null
block, 0) or from the last decode batch, the kernels skip a state index <= 0, and the prompt's
recurrent state is never written: every later token of that request reads garbage.

What this script keeps of vLLM 0.33.0 (torch only, no vLLM):
- `GPUModelRunner._is_uniform_decode` (`vllm/v1/worker/gpu_model_runner.py`): the largest query is
  1+k and the token count is 1+k per request; with `--repair`, also every request past its prompt
  (vLLM PR #53059);
- `GDNAttentionMetadataBuilder.build` (`vllm/v1/attention/backends/gdn_attn.py`): persistent
  `spec_state_indices` / `num_accepted_tokens` buffers, staged only when the batch has no prefill;
  `build_for_cudagraph_capture` stages them from all-zero block tables;
- the FLA recurrent kernel's guard: a row whose state index is <= 0 reads and writes no state;
- a FULL graph captured over those buffers (a CUDA graph on a GPU; on a CPU the same call reading
  the buffers at replay time, which is what a graph does).

Run: `python3 vllm_53051.py [--device cpu|cuda] [--repair]`. Exit 1 when the prompt's state was not
written (the bug reproduces), 0 when it matches an eager prefill, 2 on bad arguments.
"""
import argparse
import sys

import torch

K = 2  # draft tokens a decode carries (MTP with num_speculative_tokens=2, as the B70 packet ran)
H, D = 4, 16  # heads and head size of the toy recurrence: the bug is in the control path, not the maths
BLOCKS = 8  # state blocks; block 0 is the null block


def gated_delta_step(S, q, k, v, g, beta):
    """One token of the gated delta rule on S [H, D, D] (fp32)."""
    k = k / (k.norm(dim=-1, keepdim=True) + 1e-6)
    q = q / (q.norm(dim=-1, keepdim=True) + 1e-6) * D ** -0.5
    S = S * torch.exp(g)[:, None, None]
    delta = beta[:, None] * (v - torch.einsum("hd,hde->he", k, S))
    S = S + k[:, :, None] * delta[:, None, :]
    return S, torch.einsum("hd,hde->he", q, S)


def features(ids, seed=0):
    """q, k, v, g, beta of each token id (a fixed random projection of the id)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(64, 3 * H * D + 2 * H, generator=g)
    x = table[ids % 64]
    q, k, v = x[:, :H * D].view(-1, H, D), x[:, H * D:2 * H * D].view(-1, H, D), x[:, 2 * H * D:3 * H * D].view(-1, H, D)
    return q, k, v, -torch.nn.functional.softplus(x[:, -2 * H:-H]), torch.sigmoid(x[:, -H:])


def spec_recurrence(ssm, idx, accepted, q, k, v, g, beta):
    """The spec path for requests of 1+K tokens each: the state from column accepted-1, the state
    after token t into column t; rows with a source index <= 0 are skipped (the FLA guard)."""
    outs = []
    for b in range(idx.shape[0]):
        src = idx[b].gather(0, (accepted[b:b + 1] - 1).long())
        ok = src > 0
        S = torch.where(ok, ssm.index_select(0, src.clamp(min=0).long())[0], torch.zeros_like(ssm[0]))
        for t in range(1 + K):
            j = b * (1 + K) + t
            S, o = gated_delta_step(S, q[j], k[j], v[j], g[j], beta[j])
            dst = idx[b, t:t + 1].long()
            keep = (dst > 0) & ok
            ssm.index_copy_(0, dst.clamp(min=0), torch.where(keep, S, ssm.index_select(0, dst.clamp(min=0))[0])[None])
            outs.append(torch.where(ok, o, torch.zeros_like(o)))
    return torch.stack(outs)


def prefill(ssm, block, q, k, v, g, beta):
    """An eager prefill from zero state, its final state written to `block`."""
    S = torch.zeros_like(ssm[0])
    for t in range(q.shape[0]):
        S, _ = gated_delta_step(S, q[t], k[t], v[t], g[t], beta[t])
    ssm[block] = S


class Runner:
    def __init__(self, device, repair):
        self.device, self.repair = device, repair
        self.ssm = torch.zeros(BLOCKS, H, D, D, device=device)
        # the builder's persistent buffers, one decode request (1+K tokens) wide
        self.spec_idx = torch.zeros(1, 1 + K, dtype=torch.int32, device=device)
        self.accepted = torch.ones(1, dtype=torch.int32, device=device)
        self.tokens = torch.zeros(1 + K, dtype=torch.long, device=device)
        self.graph = None
        self._capture()

    def _replay_body(self):
        q, k, v, g, beta = (t.to(self.device) for t in features(self.tokens.cpu()))
        return spec_recurrence(self.ssm, self.spec_idx, self.accepted, q, k, v, g, beta)

    def _capture(self):
        """`build_for_cudagraph_capture`: the buffers staged from all-zero block tables, then capture."""
        self.spec_idx.zero_()
        self.accepted.fill_(1 + K)
        if self.device.type == "cuda":
            saved = self.ssm.clone()
            q, k, v, g, beta = (t.to(self.device) for t in features(torch.zeros(1 + K, dtype=torch.long)))
            self.feats = [q, k, v, g, beta]
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                spec_recurrence(self.ssm, self.spec_idx, self.accepted, *self.feats)  # warm-up
            torch.cuda.current_stream().wait_stream(s)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                spec_recurrence(self.ssm, self.spec_idx, self.accepted, *self.feats)
            self.ssm.copy_(saved)

    def replay(self, ids):
        if self.graph is None:  # the CPU: the same call, reading the buffers now, as a replay does
            self.tokens.copy_(torch.tensor(ids))
            self._replay_body()
            return
        for dst, src in zip(self.feats, features(torch.tensor(ids))):
            dst.copy_(src.to(self.device))
        self.graph.replay()

    def step(self, ids, block, prompt_len, computed):
        """One step of one request: the uniform-decode rule, the builder, then FULL replay or eager."""
        query, prefilling = len(ids), computed < prompt_len
        uniform = query == 1 + K and not (self.repair and prefilling)  # `_is_uniform_decode` (+ PR #53059)
        if not prefilling:  # `_stage_spec_decode`: only a batch without a prefill is staged
            self.spec_idx[0] = torch.tensor([block] + [0] * K, dtype=torch.int32)
            self.accepted.fill_(1)
        if uniform:
            self.replay(ids)
        else:
            prefill(self.ssm, block, *(t.to(self.device) for t in features(torch.tensor(ids))))
        return "FULL graph" if uniform else "eager prefill"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cpu", "cuda"))
    ap.add_argument("--repair", action="store_true", help="apply the past-prompt check of vLLM PR #53059")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device", file=sys.stderr)
        return 2
    device = torch.device(a.device)
    runner = Runner(device, a.repair)
    prompt, block = [11, 22, 33], 3  # a 3-token prompt: 1+K tokens, the shape of a decode
    how = runner.step(prompt, block, prompt_len=3, computed=0)
    want = torch.zeros(BLOCKS, H, D, D)
    prefill(want, block, *features(torch.tensor(prompt)))
    got = runner.ssm[block].cpu()
    written = torch.allclose(got, want[block], atol=1e-5)
    print(f"device {a.device}, k={K}, a {len(prompt)}-token prompt ran through the {how}; "
          f"its state block {block} was {'written as an eager prefill writes it' if written else 'NOT written'} "
          f"(max |state| {float(got.abs().max()):.3g}, eager prefill {float(want[block].abs().max()):.3g})")
    if written:
        print("not reproduced: the prompt's recurrent state is what an eager prefill computes")
        return 0
    print("REPRODUCED vLLM #53051: a prefill of 1+k tokens was dispatched as a uniform decode into the FULL "
          "graph, whose unstaged metadata skipped every state write")
    return 1


if __name__ == "__main__":
    sys.exit(main())
