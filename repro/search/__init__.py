"""Hypothesis search for a replay that departs from eager. Two engines, each for what it does best:

- `hunt.py` (with `strategies.py`): `@given` over whole request sequences. A sequence is data (a
  `Sequence`, the JSON `repro run --sequence` replays), so what it finds is saved, shrunk further by
  domain moves (`merge_pass`), re-run under each fixed rule (`blind.py`, `blame.py`) and written
  into a report. `repro hunt` and `repro bench --hunt-rates` run this engine.
- `machine.py`: a `RuleBasedStateMachine` whose rules are what a runtime does between replays and
  no sequence file can say: allocator churn, a dropped size recaptured, a replay moved to a side
  stream, several steps run back to back. The test suite runs it (`tests/test_machine.py`); its
  counterexamples are rule lists, not replayable sequences, so no command runs it.

Both draw their steps from the one scheduler (`repro.scheduler`) and count the control rules' edges
they reach (`edges.py`)."""
