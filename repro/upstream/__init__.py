"""vLLM's own control code beside the mirror (`repro/control/`): the one seam where the suite imports
vLLM, so the rest stays torch-only and `import repro` never needs it.

- `load.load()`: the installed release's control modules, loaded on a machine without a GPU by that
  release's module (`v0_33`, `v0_26`: every version-specific trick, nowhere else);
- `case.Case` and `config.vllm_config(up, case)`: a real `VllmConfig` from a case (checkpoint folder,
  mode, K, capture sizes, sequences, step budget, block size);
- `dispatch`, `runner`, `builder`, `input_batch`: vLLM's dispatcher, uniform-decode decision and draft
  bookkeeping, GDN metadata builder and persistent batch behind calls shaped like the mirror's
  (`repro.control.dispatch`, `.builder`, `.input_batch`), so a test feeds both the same inputs;
- `schedule`, `rows`: vLLM's V1 `Scheduler` driven by a suite `Sequence`, the V1 runner's rows of
  each step rebuilt on vLLM's `InputBatch`: the `StepBatch`es vLLM makes of the sequence;
- the conformance run (`repro conform`) lives beside it in `repro/conform`: the same generated inputs through both.
"""
