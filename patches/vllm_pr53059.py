"""vLLM PR #53059: a batch is a uniform decode only when every request is past its prompt.

The hunk (`vllm/v1/worker/gpu_model_runner.py: GPUModelRunner._is_uniform_decode`, the fix proposed
for vLLM #53051): the method stops being a staticmethod; `force_uniform_decode` (capture and dummy
runs) still decides alone, and after the shape test the batch is uniform only if
`input_batch.num_computed_tokens_cpu[:num_reqs] >= input_batch.num_prompt_tokens[:num_reqs]` for
every request. Its one caller, `_determine_batch_execution_and_padding`, already calls it through
`self`. Read from the PR's description and the B70 lab's adoption of its hunk
(steveseguin/b70-optimization-lab PR #47, `patch_uniform_decode_alias.py`), against vLLM 0.33.0's
method, which is the PR's base form.
"""


def apply(vllm):
    def _is_uniform_decode(self, max_num_scheduled_tokens, uniform_decode_query_len, num_tokens, num_reqs,
                           force_uniform_decode=None):
        if force_uniform_decode is not None:
            return force_uniform_decode
        if not (max_num_scheduled_tokens == uniform_decode_query_len
                and num_tokens == max_num_scheduled_tokens * num_reqs):
            return False
        batch = self.input_batch
        return bool((batch.num_computed_tokens_cpu[:num_reqs] >= batch.num_prompt_tokens[:num_reqs]).all())

    vllm.replace(vllm.gpu_model_runner.GPUModelRunner, "_is_uniform_decode", _is_uniform_decode)
