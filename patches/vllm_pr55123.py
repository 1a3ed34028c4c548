"""vLLM PR #55123: assert that a FULL decode-graph replay holds no request still in its prompt.

The PR adds a replay-side guard for vLLM #53051 to `GPUModelRunner.execute_model`
(`vllm/v1/worker/gpu_model_runner.py`): once the dispatch has chosen `CUDAGraphMode.FULL`, every
request of the batch must be past its prompt (`num_computed_tokens_cpu >= num_prompt_tokens`), or
it raises `AssertionError` (a loud error in place of the silent state loss; a no-op on the correct
path: FULL implies a uniform decode). `execute_model` needs a device and does not run here, so this
file asserts right after `_determine_batch_execution_and_padding` returns to its caller that passed
no `force_uniform_decode` (`execute_model`'s call: `_dummy_run`, which always passes one, is not the
replay path the PR guards). Read from the PR's description against vLLM 0.33.0.
"""


def apply(vllm):
    runner = vllm.gpu_model_runner.GPUModelRunner
    determine = runner._determine_batch_execution_and_padding
    full = vllm.config.CUDAGraphMode.FULL

    def _determine_batch_execution_and_padding(self, num_tokens, num_reqs, *args, force_uniform_decode=None, **kw):
        out = determine(self, num_tokens, num_reqs, *args, force_uniform_decode=force_uniform_decode, **kw)
        if force_uniform_decode is None and out[0] == full:
            batch = self.input_batch
            prefilling = batch.num_computed_tokens_cpu[:num_reqs] < batch.num_prompt_tokens[:num_reqs]
            assert not prefilling.any(), (
                f"FULL cudagraph dispatched for a batch with {int(prefilling.sum())} request(s) still in their prompt "
                f"(batch descriptor {out[1]}): its persistent metadata was not staged (vLLM #53051)")
        return out

    vllm.replace(runner, "_determine_batch_execution_and_padding", _determine_batch_execution_and_padding)
