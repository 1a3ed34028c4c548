"""The main job: which cases a run plans, each case in lockstep, and the results table and exit
code."""
