"""What the sources say about each function: plain immutable data, made by
sources.torchgen from torchgen's objects (which never leave that module).

Named tuples rather than frozen dataclasses: a scan makes one per function
(3,000+), and a frozen dataclass's __init__ costs several times more."""

from __future__ import annotations

from typing import NamedTuple

from ..vocabulary import Form, Gap, Kind

# the kinds of schema whose written arguments are outputs (functional and scratch ones write
# metadata or scratch space)
_KERNEL_KINDS = frozenset((Kind.INPLACE, Kind.OUT, Kind.MUTABLE))


def kernel_candidate(kind: Kind, written: tuple, returns: int, view: bool) -> bool:
    """Whether a generated ADInplaceOrView kernel could serve a function: it writes an argument,
    returns nothing, is not a view, and is of a kind whose written arguments are outputs. The scan
    asks torchgen's C++ API for the signatures of exactly these (the rule is here only)."""
    return bool(written) and not returns and not view and kind in _KERNEL_KINDS


class WrittenArg(NamedTuple):
    name: str
    form: Form


class CppSig(NamedTuple):
    """A dispatcher signature in C++ terms, as torchgen's C++ API spells it."""

    formals: tuple[tuple[str, str], ...]  # (type, name), schema order, keyset excluded
    call_args: tuple[str, ...]
    unambiguous_name: str  # at::_ops::<this>
    root_name: str  # ATen/ops/<this>_ops.h

    def to_json(self) -> dict:
        return {"formals": [list(x) for x in self.formals], "call_args": list(self.call_args),
                "unambiguous_name": self.unambiguous_name, "root_name": self.root_name}

    @staticmethod
    def from_json(d: dict) -> CppSig:
        return CppSig(tuple(tuple(x) for x in d["formals"]), tuple(d["call_args"]), d["unambiguous_name"],
                      d["root_name"])


class Facts(NamedTuple):
    """What torchgen and the autograd codegen say about one function (see sources.torchgen)."""

    name: str
    schema: str
    file: str
    line: int
    kind: Kind  # torchgen's SchemaKind
    written: tuple[WrittenArg, ...]
    returns: int
    view: bool  # the codegen's get_view_info
    generates: bool  # the codegen registers an ADInplaceOrView kernel (and uses the derived type)
    composite_implicit: bool
    manual: bool  # in MANUAL_AUTOGRAD: kernels written by hand in VariableTypeManual.cpp
    cpp: CppSig | None  # for candidates of a generated kernel
    # What the autograd codegen's VariableType kernel for this op leaves out (gen_variable_type, asked):
    # Gap.OUT: an out= op with a differentiable input whose kernel never calls throw_error_out_requires_grad;
    # Gap.INPLACE: a void in-place op whose kernel never calls check_inplace; Gap.NONE otherwise.
    autograd_gap: Gap = Gap.NONE
    grad_name: str = ""  # Gap.OUT: the name PyTorch's refusal prints (the codegen's get_base_name)
    grad_inputs: tuple[str, ...] = ()  # Gap.OUT: its differentiable inputs (torchgen's is_differentiable)
