"""How every `repro::` op is defined: a schema inferred from the Python signature, one
`CompositeExplicitAutograd` kernel (the body), and a fake for meta tensors.

Not `torch.library.custom_op`: its Python layers (autograd wrapper, dynamo guard, alias check on
every result) cost about 33 us of host time per call on the H200 machine, as much as the rest of a
fused op's host path (`tools/launch_cost.py`, issue 19: an eager decode step calls about fifteen
of them, so this alone was ~0.5 ms of a 4.6 ms checked step). A plain `torch.library.Library`
definition dispatches straight to the body. What is the same: the schema (the same inference,
`mutates_args` marking written arguments `Tensor(a!)`), dispatch through `torch.ops.repro.*`
(TorchDispatchModes, the CPU tape and the lint see each call as one op with its schema), fakes
(`register_fake`), `torch.library.opcheck`. What is not done per call any more: the alias check
of results (`tests/test_kernels_opcheck.py` checks every op and provider for it instead) and
version-counter bumps of mutated inputs (nothing here runs autograd: the islands step under
`torch.inference_mode`).
"""
from __future__ import annotations

import torch

_LIB = torch.library.Library("repro", "DEF")  # noqa: TOR901  (the namespace's one definition site)


class Op:
    """`torch.ops.repro.<name>` as the decorated function's name: call it, or `register_fake`."""

    def __init__(self, name: str, fn):
        self.name = name
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self._op = getattr(torch.ops.repro, name).default

    def __call__(self, *args, **kwargs):
        return self._op(*args, **kwargs)

    def register_fake(self, fake):
        torch.library.register_fake(f"repro::{self.name}", fake, lib=_LIB)
        return fake

    def __repr__(self) -> str:
        return f"<op repro::{self.name}>"


def define(name: str, mutates_args=()):
    """Decorator: `repro::name` with the function as its kernel on every device."""
    def wrap(fn) -> Op:
        _LIB.define(name + torch.library.infer_schema(fn, mutates_args=mutates_args))
        _LIB.impl(name, fn, "CompositeExplicitAutograd")
        return Op(name, fn)
    return wrap
