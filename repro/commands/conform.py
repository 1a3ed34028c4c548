"""`repro conform` from its typed config: the mirror's control rules against the installed vLLM's own
code (`repro.conform.run.conform`), as a table, and as JSON with `--json`.

Exit codes: 0 when every difference is explained, 1 when one is not (or a FULL replay read a buffer
row vLLM never wrote), 2 on bad input (vLLM absent or a release the seam does not know, a stack
profile that claims no release here without `--stack`, an output that cannot be written)."""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput
from ..io import check_output_file, emit, write_json
from ..knobs.stacks import stack as find_stack
from ..conform.run import CLAIMS, Budget, conform
from ..conform.table import text
from ..upstream.load import installed, load


@dataclass(frozen=True)
class ConformConfig:
    """What `repro conform` needs."""

    stack: str | None = None  # None: the profile that claims the installed release
    cases: int = Budget.cases  # runner configurations of the dispatch family
    sequences: int = Budget.sequences  # request sequences for each K and block size of the step families
    seed: int = 0
    json: Path | None = None
    quiet: bool = False
    cache: Path | None = None  # the cache holding the embedded checkpoint (`$REPRO_CACHE`; None: the default)
    argv: tuple[str, ...] = ()  # the command line, recorded in the JSON


def default_stack(version: str | None) -> str:
    """The profile that claims `version`."""
    name = next((s for s, v in CLAIMS.items() if v == version), None)
    if name is None:
        raise BadInput(f"no stack profile claims vLLM {version} (profiles: "
                       + ", ".join(f"{s} claims {v}" for s, v in CLAIMS.items()) + "): name one with --stack")
    return name


def conform_command(c: ConformConfig) -> int:
    """`repro conform`: compare, print the table, write the JSON; 0 clean, 1 on a difference."""
    check_output_file(c.json, "--json")
    up = load()
    stack = find_stack(c.stack or default_stack(installed()))
    note = None if c.quiet else (lambda s: print(f"repro conform: {s}", file=sys.stderr, flush=True))
    result = conform(up, stack, Budget(c.cases, c.sequences), c.seed, note, c.cache)
    doc = {"command": shlex.join(["repro", *c.argv]), **result.to_json()}
    emit(text(doc))
    if c.json:
        write_json(c.json, doc)
    return 1 if result.differences else 0
