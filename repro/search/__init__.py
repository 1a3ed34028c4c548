"""Hypothesis search over request sequences and scheduler actions: strategies, the state
machine and `repro hunt`."""
