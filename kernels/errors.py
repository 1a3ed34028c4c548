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



class KernelRefused(ValueError):
    """A call a provider will not run, in one line: the kernel it stands for refuses it (a check in
    that kernel's own sources, quoted), or its sources leave the outcome unknown (an index out of
    the cache, an uninitialised buffer, two rows of one launch racing on one state block), so the
    provider says so rather than guess."""
