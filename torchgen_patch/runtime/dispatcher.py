"""The one module that talks to the dispatcher (``torch._C``) of the running torch.

Schemas, kernels registered per dispatch key, where an operator was
registered, and the keyset helpers a Python kernel needs. Every private
``torch._C`` call of the package is here, so a torch change touches one file.
"""

from __future__ import annotations

import re

from ..errors import require_torch

_REGISTERED = re.compile(r"^debug: registered at (.+?):(\d+)\s*$", re.M)


def _c():
    return require_torch("this command")._C  # the dispatcher's bindings


def schema_of(op: str):
    """The registered FunctionSchema of ``ns::name.overload``, or None if absent."""
    base, _, overload = op.partition(".")
    try:
        return _c()._get_schema(base, overload)
    except RuntimeError:
        return None


def has_kernel(op: str, key: str) -> bool:
    return bool(_c()._dispatch_has_kernel_for_dispatch_key(op, key))


def dispatcher_state(op: str):
    """(the registered FunctionSchema or None if absent, has an ADInplaceOrView kernel)."""
    schema = schema_of(op)
    if schema is None:
        return None, False
    return schema, has_kernel(op, "ADInplaceOrView")


def same_schema(yaml_schema: str, runtime_schema) -> bool:
    """Compare with torch's own schema parser, so that default values spelled
    differently (``Mean`` and ``1``, ``0`` and ``0.``) compare equal."""
    try:
        return _c().parse_schema(yaml_schema) == runtime_schema
    except RuntimeError:
        return yaml_schema == str(runtime_schema)


def all_op_names() -> list[str]:
    return sorted(_c()._dispatch_get_all_op_names())


def registered_at(op: str) -> tuple[str, int]:
    """Where ``op`` was defined (file, line), as the dispatcher's dump says; ("<runtime>", 0) if unknown."""
    m = _REGISTERED.search(_c()._dispatch_dump(op))
    return (m.group(1), int(m.group(2))) if m else ("<runtime>", 0)


def written_args(schema) -> tuple[str, ...]:
    return tuple(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)


def is_view(schema) -> bool:
    return any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def below_inplace_or_view():
    """(the keyset after ADInplaceOrView, the guard that dispatches below it), for Python kernels."""
    c = _c()
    return c._after_ADInplaceOrView_keyset, c._AutoDispatchBelowADInplaceOrView


def below_inplace_or_view_guard():
    """A context that dispatches below ADInplaceOrView (and autograd): an op run
    inside it skips every ADInplaceOrView kernel, this project's included."""
    return _c()._AutoDispatchBelowADInplaceOrView()


def disabled_torch_function():
    """The ``__torch_function__`` of a subclass that only wants ``__torch_dispatch__``."""
    return _c()._disabled_torch_function_impl


def version_bumper():
    """A function that bumps the version counter of each tensor of a sequence once: this torch's own
    ``torch._C._increment_version`` where it takes a sequence (2.5 on), one call per tensor where it
    takes one tensor (2.4). Inference tensors, which have no counter, must not be among them."""
    bump = _c()._increment_version
    try:
        bump(())
        return bump
    except (TypeError, RuntimeError):  # "incompatible function arguments": it takes one tensor
        def each(tensors) -> None:
            for t in tensors:
                bump(t)

        return each
