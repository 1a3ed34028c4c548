"""vLLM PR #47123: no uniform decode for a hybrid model's batch with a request still in its prompt.

The PR computes `force_uniform_decode=False` in `GPUModelRunner.execute_model`
(`vllm/v1/worker/gpu_model_runner.py`) when the model is hybrid (recurrent-state layers beside
attention: `model_config.is_hybrid`) and the batch holds a context request (one whose computed tokens
are short of its prompt: `num_computed_tokens_cpu < num_prompt_tokens`), and passes it to
`_determine_batch_execution_and_padding`. `execute_model` needs a device and does not run here, so
this file makes the same computation at the top of `_determine_batch_execution_and_padding` when
its caller passed no `force_uniform_decode` (`execute_model`'s call: `_dummy_run` always passes
one). Read from the PR's description (the shape test misroutes a 1+k-token prompt of a hybrid model
into the spec-decode path) against vLLM 0.33.0.
"""


def apply(vllm):
    runner = vllm.gpu_model_runner.GPUModelRunner
    determine = runner._determine_batch_execution_and_padding

    def _determine_batch_execution_and_padding(self, num_tokens, num_reqs, *args, force_uniform_decode=None, **kw):
        if force_uniform_decode is None and self.model_config.is_hybrid:
            batch = self.input_batch
            if (batch.num_computed_tokens_cpu[:num_reqs] < batch.num_prompt_tokens[:num_reqs]).any():
                force_uniform_decode = False
        return determine(self, num_tokens, num_reqs, *args, force_uniform_decode=force_uniform_decode, **kw)

    vllm.replace(runner, "_determine_batch_execution_and_padding", _determine_batch_execution_and_padding)
