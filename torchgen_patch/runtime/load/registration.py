"""Registration: the kernels of a checked library (or the Python ones) registered in this torch's
dispatcher, each op refused, with a reason, when this torch lacks it, when its schema differs from
the yaml the code came from, or when it already has an ADInplaceOrView kernel; and removed again.
What is registered is ``state.REGISTRY``'s."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field

from ...errors import EnvironmentProblem, InputError, one_line, require_torch, unknown_names
from ...vocabulary import Backend, CheckMode, plural
from .loader import load, load_built
from .state import REGISTRY


@dataclass
class InstallReport:
    backend: Backend
    library: str | None = None
    registered: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)  # installed earlier by torchgen-patch
    refused: dict[str, str] = field(default_factory=dict)  # op -> why
    prebuilt: str | None = None  # the installed prebuilt kernels used (their version), if any
    prebuilt_unused: str | None = None  # why installed prebuilt kernels were not used
    optimizers: list[str] = field(default_factory=list)  # the overlay's optimizer entries active (runtime/optim.py)
    check_saved: CheckMode | None = None  # the saved-tensor check's mode, when install() turned it on

    def summary(self) -> str:
        lines = [f"torchgen-patch install ({self.backend}): {len(self.registered)} registered, "
                 f"{len(self.already)} already active, {len(self.refused)} refused; "
                 f"{plural(len(self.optimizers), 'optimizer entry', 'optimizer entries')} active"]
        if self.check_saved:
            lines.append(f"  saved-tensor check: {self.check_saved}")
        if self.prebuilt:
            lines.append(f"  prebuilt: {self.prebuilt} ({self.library})")
        if self.prebuilt_unused:
            lines.append(f"  prebuilt kernels not used: {self.prebuilt_unused}")
        for op, why in sorted(self.refused.items()):
            lines.append(f"  refused {op}: {why}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Candidate:
    op: str
    schema: str
    written: tuple = ()
    refuse: tuple | None = None  # (name PyTorch prints, arguments): the kernel refuses requires_grad


def check(candidates: list[Candidate]) -> tuple[list[Candidate], list[str], dict[str, str]]:
    """Split candidates into (to register, already ours, refused with reason)."""
    from ..dispatcher import dispatcher_state, same_schema

    ok, already, refused = [], [], {}
    for c in candidates:
        if c.op in REGISTRY.installed:
            already.append(c.op)
            continue
        schema, has_kernel = dispatcher_state(c.op)
        if schema is None:
            refused[c.op] = "this torch has no such operator"
        elif not same_schema(c.schema, schema):
            refused[c.op] = f"schema differs: the kernel was made for '{c.schema}', this torch has '{schema}'"
        elif has_kernel:
            refused[c.op] = "already has an ADInplaceOrView kernel in this torch"
        else:
            ok.append(c)
    return ok, already, refused


def register(artifact, ops: list[str] | None = None, backend: Backend = Backend.CPP) -> InstallReport:
    """Register the kernels of ``artifact`` (runtime.Artifact; ``ops``: a subset), from the library
    loaded from the very descriptor its checks ran on (trust.check_library)."""
    if backend != Backend.CPP:
        raise InputError(None, None, f"an artifact is a compiled library: backend '{backend}' does not load one",
                         "use install(backend='python') for the Python kernels")
    rep = _install_cpp(artifact.path, select([Candidate(op, schema) for op, schema in artifact.kernels], ops),
                       lambda: load(artifact.path, artifact.sha256, artifact.root, artifact.key))
    rep.prebuilt = artifact.prebuilt
    rep.prebuilt_unused = artifact.prebuilt_unused
    return rep


def select(cands: list[Candidate], ops: list[str] | None) -> list[Candidate]:
    if ops is None:
        return cands
    by = {c.op: c for c in cands}
    unknown = [o for o in ops if o not in by]
    if unknown:
        raise unknown_names("the plan", unknown, by)
    return [by[o] for o in ops]


def _refused_by_torch(dll: ctypes.CDLL, path: str, error_fn: str) -> EnvironmentProblem:
    """Torch refused a registration (a C++ exception caught inside the library, nothing registered)."""
    fn = getattr(dll, error_fn)
    fn.restype, fn.argtypes = ctypes.c_char_p, []
    said = (fn() or b"").decode("utf-8", errors="replace")
    return EnvironmentProblem(f"torch refused the kernels of {path}: {one_line(said) or 'an unknown C++ exception'}; "
                              "nothing was registered",
                              f"remove {os.path.dirname(path)} and build again (torchgen-patch build)")


def _c_names(names: list[str]):
    return (ctypes.c_char_p * len(names))(*[n.encode() for n in names])


def _python_kernel(op: str, written, evidence=None, refuse=None) -> object:
    """Register the Python fallback kernel for ``op`` (ns::name.overload); returns the Library."""
    torch = require_torch("installing the kernels")
    from ..pykernel import make_kernel

    ns, rest = op.split("::", 1)
    base, _, overload = rest.partition(".")
    opov = getattr(getattr(getattr(torch.ops, ns), base), overload or "default")
    lib = torch.library.Library(ns, "IMPL")
    lib.impl(rest, make_kernel(opov, written, evidence, refuse), "ADInplaceOrView", with_keyset=True)
    return lib


def _install_cpp(path: str, cands: list[Candidate], load=None) -> InstallReport:
    """``load``: () -> the checked, loaded library (default: a torchgen-patch build at ``path``)."""
    rep = InstallReport(Backend.CPP, library=path)
    ok, rep.already, rep.refused = check(cands)
    if not ok:
        return rep
    dll = load() if load else load_built(path)
    dll.torchgen_patch_register.restype = ctypes.c_int64
    dll.torchgen_patch_register.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_int64]
    n = dll.torchgen_patch_register(_c_names([c.op.split("::", 1)[1] for c in ok]), len(ok))
    if n < 0 and -n - 1 < len(ok):
        raise InputError(path, None, f"the library has no kernel for {ok[-n - 1].op}: rebuild it")
    if n < 0:
        raise _refused_by_torch(dll, path, "torchgen_patch_error")
    for c in ok:
        REGISTRY.installed[c.op] = Backend.CPP
        rep.registered.append(c.op)
    return rep


def register_python(cands: list[Candidate]) -> InstallReport:
    """Register the Python kernels (torch.library) of ``cands``, refused as the C++ ones are."""
    rep = InstallReport(Backend.PYTHON)
    ok, rep.already, rep.refused = check(cands)
    for c in ok:
        REGISTRY.handles.append(_python_kernel(c.op, [w.name for w in c.written], refuse=c.refuse))
        REGISTRY.installed[c.op] = Backend.PYTHON
        rep.registered.append(c.op)
    return rep


def register_runtime(todo, backend: Backend, evidence: bool = False, boxed_library: str | None = None,
                     verbose: bool = False) -> InstallReport:
    """Register the runtime plan ``todo`` (plan.RuntimePlan): the Python kernels (``evidence``: with a
    record of what each call wrote), or the boxed library (``boxed_library``: a build of it to check
    and load, never rebuilt; else built here, ``verbose``)."""
    rep = InstallReport(backend, already=list(todo.already), refused=dict(todo.refused))
    if not todo.ops:
        return rep
    if backend == Backend.PYTHON:
        if evidence:
            from ..pykernel import Evidence

            REGISTRY.evidence = REGISTRY.evidence or Evidence()
        for op in todo.ops:
            REGISTRY.handles.append(_python_kernel(op.name, list(op.written), REGISTRY.evidence if evidence else None))
            REGISTRY.installed[op.name] = Backend.PYTHON
            rep.registered.append(op.name)
        return rep
    from ..compile import build_boxed

    # a prebuilt one (run's children): checked, never rebuilt
    rep.library = boxed_library or build_boxed(verbose=verbose).path
    dll = load_built(rep.library)
    dll.torchgen_patch_boxed_register.restype = ctypes.c_int64
    dll.torchgen_patch_boxed_register.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_int64]
    by_ns: dict[str, list[str]] = {}
    for op in todo.ops:
        ns, rest = op.name.split("::", 1)
        by_ns.setdefault(ns, []).append(rest)
    for ns, rests in sorted(by_ns.items()):
        if dll.torchgen_patch_boxed_register(ns.encode(), _c_names(rests), len(rests)) < 0:
            raise _refused_by_torch(dll, rep.library, "torchgen_patch_boxed_error")
        for r in rests:
            REGISTRY.installed[f"{ns}::{r}"] = "boxed"
            rep.registered.append(f"{ns}::{r}")
    return rep


def evidence():
    """What the runtime ops installed with ``evidence=True`` wrote, call by call (None if none)."""
    return REGISTRY.evidence


def installed_ops() -> list[str]:
    return sorted(REGISTRY.installed)


def uninstall() -> list[str]:
    """Remove every kernel torchgen-patch registered in this process (and turn off the saved-tensor
    check install() turned on)."""
    import sys

    if "torchgen_patch.saved" in sys.modules:  # a check on, or one armed to start at the first backward pass
        from ...saved import disable

        disable()
    with REGISTRY.lock:
        gone = sorted(REGISTRY.installed)
        for dll in REGISTRY.libraries.values():
            for fn in ("torchgen_patch_unregister_all", "torchgen_patch_boxed_unregister_all"):
                if hasattr(dll, fn):
                    getattr(dll, fn).restype = None
                    getattr(dll, fn)()
        from .. import optim

        optim.deactivate()
        for lib in REGISTRY.handles:
            lib._destroy()
        REGISTRY.handles.clear()
        REGISTRY.installed.clear()
        REGISTRY.evidence = None
        return gone
