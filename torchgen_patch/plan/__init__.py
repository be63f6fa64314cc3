"""Plan: which kernels to emit, with which template, in which shard.

The plan is the one source of truth shared by gen, build, install, verify,
lint and diff. Every decision is made here; templates only arrange text.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

from ..errors import InputError, Location, printable, unknown_names
from ..scan.model import COVERED, MISSING, OUT_UNCHECKED, UNSUPPORTED, OpRecord, Scan
from ..sources.facts import CppSig, WrittenArg
from ..vocabulary import Action
from .overlay import Overlay

DEFAULT_TEMPLATE = "kernel.cpp.j2"


@dataclass(frozen=True)
class Kernel:
    op: str  # aten::split_with_sizes_copy.out
    name: str  # split_with_sizes_copy.out (as registered in the aten namespace)
    fn: str  # C++ function name
    schema: str
    loc: Location  # in the yaml (generated files name only its basename)
    template: str
    formals: tuple[tuple[str, str], ...]
    call_args: tuple[str, ...]
    unambiguous_name: str
    root_name: str
    written: tuple[WrittenArg, ...]
    xfail_devices: tuple[str, ...] | None = None  # None: expected to pass; () everywhere
    xfail_reason: str | None = None
    # An out= op whose autograd kernel never refuses requires_grad: the kernel refuses instead, as
    # PyTorch's own out= kernels do, naming the op as they do (refuse_name) and checking these arguments
    # (its differentiable inputs, then what it writes). None: no such check.
    refuse_name: str | None = None
    refuse_args: tuple[str, ...] = ()

    @property
    def yaml_name(self) -> str:
        # it lands in C++ comments: one line, always
        return printable(os.path.basename(self.loc.path))  # type: ignore[type-var, arg-type]  # a yaml entry's

    @property
    def line(self) -> int:
        return self.loc.line  # type: ignore[return-value]  # a yaml entry's

    def shard(self, n: int) -> int:
        return stable_hash(self.op) % n

    @property
    def declaration(self) -> str:
        """The kernel's C++ declarator: the dispatcher signature, keyset first."""
        args = ", ".join(["c10::DispatchKeySet ks"] + [f"{t} {n}" for t, n in self.formals])
        return f"void {self.fn}({args})"


@dataclass(frozen=True)
class LeftOut:
    op: str
    loc: Location
    why: str


@dataclass(frozen=True)
class Plan:
    kernels: tuple[Kernel, ...]  # sorted by op
    left_out: tuple[LeftOut, ...]  # sorted by op
    torch_version: str

    def ops(self) -> list[str]:
        return [k.op for k in self.kernels]

    def kernel(self, op: str) -> Kernel | None:
        return next((k for k in self.kernels if k.op == op), None)

    def xfails(self) -> dict[str, tuple[str, ...]]:
        """op -> the devices the overlay expects it to fail on (empty: every device)."""
        return {k.op: k.xfail_devices for k in self.kernels if k.xfail_devices is not None}

    def pick(self, ops: list[str] | None, scan: Scan | None = None) -> list[str]:
        """``ops`` (all when None), sorted; an op the plan lacks is an error that says
        why it is not there (left out, and the reason; with ``scan``, already covered by
        PyTorch's codegen) or which planned op was meant."""
        if ops is None:
            return self.ops()
        left = {lo.op: lo for lo in self.left_out}
        for op in ops:
            if op in left:
                raise InputError(None, None, f"{op} is left out of the plan: {left[op].why}")
            record = scan.get(op) if scan is not None and op not in self.ops() else None
            if record is not None and record.verdict == COVERED:
                raise InputError(None, None, f"{op} is already covered by PyTorch's codegen (it has a generated "
                                             "ADInplaceOrView kernel): nothing to install or verify")
        unknown = sorted(set(ops) - set(self.ops()))
        if unknown:
            raise unknown_names("the plan", unknown, self.ops())
        return sorted(set(ops))


def stable_hash(key: str) -> int:
    """A hash that is the same in every process (never Python's hash())."""
    return int.from_bytes(hashlib.sha1(key.encode()).digest()[:8], "little")


def make_plan(scan: Scan, overlay: Overlay, strict: bool = False, requires_grad_check: bool = True) -> Plan:
    """``requires_grad_check`` False: no kernel refuses requires_grad (the overlay's ``requires_grad:
    allow`` says the same per op)."""
    if requires_grad_check and not scan.autograd:
        raise RuntimeError("make_plan: the scan was made without autograd (scan(..., autograd=False))")
    kernels, left_out = [], []
    for r in sorted(scan.by_verdict(MISSING) + scan.by_verdict(UNSUPPORTED), key=lambda r: r.name):
        entry = overlay.get(r.name)
        if entry is not None and entry.action == Action.SKIP:
            left_out.append(LeftOut(r.name, r.loc, f"skipped by the overlay: {entry.reason}"))
            continue
        if r.verdict == UNSUPPORTED:
            if strict:
                raise InputError(r.loc.path, r.loc.line, f"{r.name}: cannot generate a kernel: {r.reason}",
                                 "add a 'skip' entry with a reason to the overlay")
            left_out.append(LeftOut(r.name, r.loc, r.reason))
            continue
        kernels.append(_kernel(r, entry, scan.cpp[r.name], requires_grad_check))
    return Plan(tuple(sorted(kernels, key=lambda k: k.op)), tuple(sorted(left_out, key=lambda lo: lo.op)),
                scan.torch_version)


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _check_identifiers(r: OpRecord, sig: CppSig) -> None:
    """Argument names become C++ parameters and the operator's name a C++ function: torchgen's
    schema parser checks neither. A name that is no identifier, an argument name reserved for the
    C++ implementation, or an operator name that C++ cannot declare is refused at its yaml line."""
    for name in [n for _, n in sig.formals] + list(sig.call_args) + [w.name for w in r.written]:
        if not _IDENTIFIER.match(name):
            raise InputError(r.loc.path, r.loc.line, f"{r.name}: argument name {printable(repr(name))} is not a "
                                                     "C++ identifier", "names are letters, digits and '_'")
        if reserved(name):
            raise InputError(r.loc.path, r.loc.line, f"{r.name}: argument name '{name}' is reserved for the C++ "
                                                     "implementation, whose compiler and library define macros "
                                                     "with such names (__LINE__, _GLIBCXX_...)",
                             "rename the argument: no '__' in it, no '_' and a capital at its start")
    why = function_name_problem(sig.unambiguous_name)
    if why:
        raise InputError(r.loc.path, r.loc.line, f"{r.name}: its C++ name '{sig.unambiguous_name}' is {why}: no "
                                                 "kernel (nor PyTorch's own codegen) can declare a function of "
                                                 "that name", "rename the operator")


def function_name_problem(fn: str) -> str | None:
    """Why an operator's C++ function name ``fn`` (``at::_ops::<fn>``, the kernel's) cannot be declared,
    or None: a keyword, a macro's name, or a name that starts as C++ reserves for its implementation
    (unless it starts with one of Python's operator methods, which PyTorch's operators are named after:
    ``__and___Tensor``)."""
    if fn in CPP_KEYWORDS:
        return "a C++ keyword"
    if macro_like(fn):
        return "a macro's name"
    if re.match(r"__|_[A-Z]", fn) and not _PYTHON_DUNDER.match(fn):
        return "reserved for the C++ implementation"
    return None


# C++ keywords and alternative tokens (C++20): none can name a parameter or a function.
CPP_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class
compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype
default delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline
int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public register
reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch template
this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t
while xor xor_eq""".split())
# The names the kernel templates declare or use unqualified beside the parameters.
TEMPLATE_NAMES = frozenset({"ks", "guard", "at", "c10", "std", "torchgen_patch"})
# Macros with a lower-case letter in their names that the C and C++ libraries (glibc's included), the
# compilers (GNU mode: `linux`, `unix`) and torch's headers define where the generated kernels are
# compiled (tests/test_cpp_names.py compares this with the compiler's own list). Names spelt as macros
# are (macro_like) also taken for macros: with no lower-case letter (EOF, NULL, TORCH_CHECK), or
# capitals and '_' first (M_PIf, L_tmpnam, C10_DEFINE_bool).
C_MACROS = frozenset("""
alloca assert assert_perror errno math_errhandling offsetof setjmp sigsetjmp va_arg va_copy va_end va_start
stdin stdout stderr be16toh be32toh be64toh htobe16 htobe32 htobe64 htole16 htole32 htole64 le16toh le32toh
le64toh issubnormal iscanonical issignaling iszero pthread_cleanup_pop pthread_cleanup_pop_restore_np
pthread_cleanup_push pthread_cleanup_push_defer_np sched_priority strdupa strndupa major minor makedev linux unix
i386 MaxTypeIndex""".split())
_MACRO_SPELLING = re.compile(r"[A-Z0-9_]{2,}|[A-Z][A-Z0-9]*_\w*")
# Python's operator methods: PyTorch's operators named so (__and__, __ilshift__) compile, being no macros
_PYTHON_DUNDER = re.compile(r"__(?:[ir]?(?:and|or|xor|lshift|rshift|add|sub|mul|matmul|truediv|floordiv|div|mod|"
                            r"pow)|neg|pos|invert|abs|lt|le|gt|ge|eq|ne)__")


def macro_like(name: str) -> bool:
    """Whether ``name`` may be a macro where the kernels are compiled: one of C_MACROS, or spelt as one."""
    return name in C_MACROS or bool(_MACRO_SPELLING.fullmatch(name))


def reserved(name: str) -> bool:
    """An identifier C++ reserves for its implementation: ``__`` anywhere, or ``_`` and a capital first
    (compilers and libraries define macros named so: __LINE__, __linux__, _GLIBCXX_ASSERTIONS)."""
    return "__" in name or bool(re.match(r"_[A-Z]", name))


def cpp_names(formals: list[str], written: list[str]) -> dict[str, str]:
    """The fixed mangling of argument names that cannot be C++ parameters of a generated kernel:
    a C++ keyword, a macro's name (``errno``, ``EOF``, ``assert``: ``macro_like``), a name the template
    uses (``ks``, ``guard``, ...) or one that collides with a written argument's snapshot (``X_before``)
    gets trailing underscores until it is free. Returns {schema name: C++ name} for the renamed ones."""
    out: dict[str, str] = {}
    while True:
        names = {out.get(n, n) for n in formals}
        snapshots = {out.get(w, w) + "_before" for w in written}
        bad = next((n for n in formals if (n not in out and macro_like(n))
                    or out.get(n, n) in CPP_KEYWORDS | TEMPLATE_NAMES | snapshots), None)
        if bad is None:
            return out
        m = out.get(bad, bad) + "_"
        while m in names or m in snapshots or m in TEMPLATE_NAMES or m in C_MACROS:
            m += "_"
        out[bad] = m


def _kernel(r: OpRecord, entry, sig: CppSig, requires_grad_check: bool = True) -> Kernel:
    _check_identifiers(r, sig)
    refuse = (requires_grad_check and r.autograd_gap == OUT_UNCHECKED
              and (entry is None or entry.requires_grad == "refuse"))
    rename = cpp_names([n for _, n in sig.formals], [w.name for w in r.written])
    sig = CppSig(tuple((t, rename.get(n, n)) for t, n in sig.formals),
                 tuple(rename.get(a, a) for a in sig.call_args), sig.unambiguous_name, sig.root_name)
    written = tuple(w._replace(name=rename.get(w.name, w.name)) for w in r.written)
    refuse_args: tuple[str, ...] = ()
    if refuse:
        formals = {n for _, n in sig.formals}
        asked = tuple(dict.fromkeys((*r.grad_inputs, *(w.name for w in r.written))))
        if not (_IDENTIFIER.match(r.grad_name or "") and all(a in formals for a in (rename.get(n, n) for n in asked))):
            raise InputError(r.loc.path, r.loc.line,
                             f"{r.name}: the autograd facts name {printable(repr(r.grad_name))} "
                             "or arguments the schema does not have", "regenerate the scan (--no-cache)")
        refuse_args = tuple(rename.get(n, n) for n in asked)
    xfail_devices = None
    xfail_reason = None
    if entry is not None and entry.action == Action.XFAIL:
        xfail_devices, xfail_reason = tuple(entry.devices), entry.reason
    return Kernel(
        op=r.name,
        name=r.name.split("::", 1)[1],
        fn=sig.unambiguous_name,
        schema=r.schema,
        loc=r.loc,
        template=(entry.template if entry is not None and entry.template else DEFAULT_TEMPLATE),
        formals=sig.formals,
        call_args=sig.call_args,
        unambiguous_name=sig.unambiguous_name,
        root_name=sig.root_name,
        written=written,
        xfail_devices=xfail_devices,
        xfail_reason=xfail_reason,
        refuse_name=r.grad_name if refuse else None,
        refuse_args=refuse_args,
    )


# ---- operators of the live registry (any namespace): their own plan -------------------------------

@dataclass(frozen=True)
class LiveOp:
    """What the running process's registry says about one operator (gathered by runtime/registry)."""

    name: str  # ns::op.overload
    schema: str | None  # None: no such operator in this process
    written: tuple[str, ...]
    view: bool
    has_kernel: bool  # an ADInplaceOrView kernel is registered already


@dataclass(frozen=True)
class RuntimePlan:
    """The live-registry operators to serve with the boxed kernel, and the others with the reason."""

    ops: tuple[LiveOp, ...]  # to register, in the order asked
    already: tuple[str, ...]  # installed earlier by torchgen-patch
    refused: dict[str, str]  # op -> why


def plan_runtime(names: list[str], overlay: Overlay, live, installed: set[str]) -> RuntimePlan:
    """Decide for each of ``names`` (exact ``ns::op.overload`` names): the overlay's skips, what
    ``installed`` already holds, and what ``live(name) -> LiveOp`` says rules a kernel out."""
    ops, already, refused = [], [], {}
    for name in names:
        if "::" not in name:
            raise InputError(None, None, f"runtime op '{name}' needs its namespace ('ns::op.overload')")
        entry = overlay.get(name)
        if entry is not None and entry.action == Action.SKIP:
            refused[name] = (f"skipped by the overlay ({os.path.basename(overlay.path or '')}:{entry.line}): "
                             f"{entry.reason}")
            continue
        if name in installed:
            already.append(name)
            continue
        op = live(name)
        if op.schema is None:
            refused[name] = "this process has no such operator (import the module that defines it first)"
        elif not op.written:
            refused[name] = "its schema writes no argument"
        elif op.view:
            refused[name] = "a view: its kernel must set up the view, which this one does not"
        elif op.has_kernel:
            refused[name] = "already has an ADInplaceOrView kernel"
        else:
            ops.append(op)
    return RuntimePlan(tuple(ops), tuple(already), refused)
