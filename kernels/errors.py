"""The errors `kernels` raises, with no dependency on `repro`.

`kernels` is a library the suite uses, not a part of the suite's command line: it must import and
fail on its own (a plugin author, a standalone script, another tool). A `KernelSelectionError` is
a `ValueError`, so callers that treat bad values as bad input catch it without knowing this
package; the `repro` CLI turns it into exit code 2.
"""
from __future__ import annotations


class KernelSelectionError(ValueError):
    """An unknown op or provider, a provider that is absent on this machine, or a plugin module
    that does not import: the message names which, in one line."""

