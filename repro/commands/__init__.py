"""The commands: each module holds one command's typed config (a frozen dataclass, so a Python caller
drives a command without the command line) and the function that runs it, composing the library.

`repro/cli/` turns arguments into these configs; the library packages below never import this one
(`tests/test_imports.py` states the layers). `run` (the main job), `hunt` (and `hunt_rates`, the
hunts `repro bench --hunt-rates` times), `report`, `bench`, `model` (make-tiny, inspect), `env`."""
