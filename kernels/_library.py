"""How every `repro::` op is defined: a schema inferred from the Python signature, one
`CompositeExplicitAutograd` kernel (the body), and a fake for meta tensors.

Not `torch.library.custom_op`: its Python layers (autograd wrapper, dynamo guard, alias check on
every result) cost about 33 us of host time per call on an H200 machine, as much as the rest of a
fused op's host path (`tools/launch_cost.py`). An eager decode step calls about fifteen of them,
so that alone would be ~0.5 ms of a 4.6 ms checked step. A plain `torch.library.Library`
definition dispatches straight to the body. What is the same: the schema (the same inference,
`mutates_args` marking written arguments `Tensor(a!)`), dispatch through `torch.ops.repro.*`
(TorchDispatchModes, the CPU tape and the lint see each call as one op with its schema), fakes
(`register_fake`), `torch.library.opcheck`. What is not done per call any more: the alias check
of results (`tests/test_kernels_opcheck.py` checks every op and provider for it instead) and
version-counter bumps of mutated inputs (nothing here runs autograd: the islands step under
`torch.inference_mode`).

Calling an `Op` (or an op of `namespace`, what the islands call) skips the dispatcher when it could
only call the body: no TorchDispatchMode and no TorchFunctionMode active (the CPU tape, the lint,
the reference copy's recorder, FakeTensorMode and opcheck all are one), no functorch transform,
gradients off (`inference_mode` / `no_grad`: the autograd keys would only pass the call on),
positional arguments only, each a plain `torch.Tensor` that is not a meta tensor, or a Python
scalar or None. The body is then called with the arguments as given: the same function the
dispatcher would reach, the same tensors in and out. Saved: the dispatcher's boxing of every
argument and result, 2-10 us of host time a call on H200 machines (`ops.rms_norm` 52.5 us against
its body's 42.9 on one; 34.0 against 31.8 on another, `docs/h200/launch-cost.txt`), about a dozen
calls in each copy's eager step, whose host path is most of a checked step.
`torch.ops.repro.<name>` itself always dispatches.
"""
from __future__ import annotations

import types

import torch

_LIB = torch.library.Library("repro", "DEF")
namespace = types.SimpleNamespace()  # every op defined here, by name, as its `Op`

_Tensor = torch.Tensor
_SCALARS = frozenset({int, float, bool, str, type(None)})
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_mode = torch._C._is_torch_function_mode_enabled
_transforms = torch._C._are_functorch_transforms_active
_grad = torch.is_grad_enabled


def _direct(args) -> bool:
    """The dispatcher could only call the body (module docstring)."""
    if _dispatch_modes() or _function_mode() or _transforms() or _grad():
        return False
    for a in args:
        t = type(a)
        if t is _Tensor:
            if a.is_meta:
                return False
        elif t not in _SCALARS:
            return False
    return True


class Op:
    """`torch.ops.repro.<name>` as the decorated function's name: call it, or `register_fake`."""

    def __init__(self, name: str, fn):
        self.name = name
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self._op = getattr(torch.ops.repro, name).default

    def __call__(self, *args, **kwargs):
        if not kwargs and _direct(args):
            return self.__wrapped__(*args)
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
        op = Op(name, fn)
        setattr(namespace, name, op)
        return op
    return wrap
