"""Install: register the kernels of the plan into the running torch.

Two backends share the plan, the refusals and the exactly-one-bump rule:
``cpp`` (the compiled library, the default) and ``python`` (torch.library
kernels, for machines without a compiler). Before registering an op it is
refused, with a reason, when this torch lacks it, when its schema differs
from the yaml the code came from, or when it already has an ADInplaceOrView
kernel — so PyTorch never warns about overriding a kernel.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import threading
from dataclasses import dataclass, field

from ..errors import EnvironmentProblem, InputError, descriptors_said, one_line, require_torch, unknown_names
from .loader import _CDLLS, _load, _load_built  # noqa: F401  (_CDLLS: uninstall's; _load_built: run's children)
from ..sources import Options
from ..vocabulary import Backend, CheckMode, plural

_LOCK = threading.Lock()


def _reset_lock_in_child() -> None:
    """A child forked while another thread held the lock would wait for it forever: it starts free."""
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_reset_lock_in_child)
_INSTALLED: dict[str, Backend] = {}  # op -> backend
_HANDLES: list = []  # keep libraries (ctypes handles, torch.library.Library) alive
_EVIDENCE = None  # pykernel.Evidence of the runtime ops installed with evidence=True


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
    from .dispatcher import dispatcher_state, same_schema

    ok, already, refused = [], [], {}
    for c in candidates:
        if c.op in _INSTALLED:
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


@dataclass(frozen=True)
class InstallOptions:
    """How ``install()`` works, beyond which ops and backend: one value instead of a keyword each."""

    library: str | None = None  # a torchgen-patch build to load (else the prebuilt kernels or the cache's)
    runtime_ops: tuple[str, ...] | list[str] | None = None  # live-registry operators (names or ns::patterns)
    verbose: bool = False
    evidence: bool = False  # runtime ops, Python backend: record which written arguments each call changed
    boxed_library: str | None = None  # a built boxed library (run's children): checked, never rebuilt
    build: bool = True  # False: no usable prebuilt kernels is an error, nothing compiles
    check_saved: CheckMode | None = None  # WARN or RAISE (or its word): the saved-tensor check too (saved.enable)
    saved_library: str | None = None  # a build of the check's native hooks (run's children): checked, never rebuilt


_SOURCE_KEYWORDS = ("native_functions", "tags", "overlay", "no_overlay", "no_cache", "requires_grad_check")


def install(ops: list[str] | None = None, backend: Backend = Backend.CPP, *, options: Options | None = None, plan=None,
            how: InstallOptions | None = None, **keywords) -> InstallReport:
    """Register ADInplaceOrView kernels for the plan's ops (or ``ops``, a subset).

    ``options`` (sources.Options): the inputs; ``plan`` (plan.Plan), when given, is used instead
    of making one; ``how`` (InstallOptions), or its fields as keywords (``library=``,
    ``runtime_ops=``, ``verbose=``, ``evidence=``, ``boxed_library=``, ``build=``,
    ``check_saved=``); and, when ``options`` is not given, its input fields as keywords
    (``native_functions=``, ``tags=``, ``overlay=``, ``no_overlay=``, ``no_cache=``,
    ``requires_grad_check=``).

    ``runtime_ops``: operators of any namespace found in the live registry
    (``torchgen-patch lint --runtime``), served by one boxed kernel that reads
    their schemas at call time; given alone, only those are installed.
    Loading twice is a no-op: ops already installed are reported as such.
    The overlay's optimizer entries (``optimizers:``) are applied too, through PyTorch's global
    optimizer step hooks (runtime/optim.py); the report lists them (``optimizers``).
    ``evidence`` (runtime ops, Python backend): also record which written arguments each call
    really changed; read it with ``evidence()`` ("declared written, never changed").
    With neither ``library`` nor ``plan``, installed prebuilt kernels (``torchgen-patch wheel``)
    are used when they match this torch exactly; else the report says why not and the cached
    build is used, unless ``build=False``, which refuses instead (InputError).
    ``requires_grad_check=False``: the kernels of out= ops do not refuse arguments that require
    grad (by default they do, with PyTorch's own message, in grad mode).
    ``check_saved`` ("warn" or "raise"): also turn on the saved-tensor check for the rest of the
    process (``torchgen_patch.check_saved``); any other value is refused (ValueError) before
    anything is built.
    """
    sources = {k: keywords.pop(k) for k in _SOURCE_KEYWORDS if k in keywords}
    unknown = sorted(set(keywords) - {f.name for f in dataclasses.fields(InstallOptions)})
    if unknown:
        raise TypeError(f"install() got unexpected keyword arguments: {', '.join(unknown)}")
    how = dataclasses.replace(how or InstallOptions(), **keywords)
    saved = None
    if how.check_saved is not None:  # the stage imported only for it (a plain install() stays light)
        from .. import saved
    mode = None if saved is None else saved.mode_of(how.check_saved)  # refused before anything is built
    with descriptors_said():  # no free descriptor, at an open or at a lazy import: one line, exit 3
        rep = _install(ops, backend, options or Options(**sources), plan, how)
        if mode is not None:
            from .checklib import prepare

            prepare(library=how.saved_library, build=how.build)
            rep.check_saved = saved.enable(mode).mode
    return rep


def _install(ops, backend: Backend, opts: Options, plan, how: InstallOptions) -> InstallReport:
    try:
        backend = Backend.parse(backend)
    except ValueError:
        raise InputError(None, None, f"unknown backend '{backend}'", "use 'cpp' or 'python'") from None
    if how.runtime_ops is not None and ops is None and how.library is None:
        if how.evidence and backend != Backend.PYTHON:
            raise InputError(None, None, "evidence=True records in the Python kernel", "use backend='python'")
        from ..plan import plan_runtime

        with _LOCK:
            todo = plan_runtime(expand_patterns(list(how.runtime_ops)), runtime_overlay(opts), live_op,
                                set(_INSTALLED))
            return _with_optimizers(opts, _install_runtime(todo, backend, how))
    with _LOCK:
        if backend == Backend.PYTHON:
            if plan is None:
                from ..pipeline import plan as make

                _, plan = make(opts)
            cands = [Candidate(k.op, k.schema, k.written, (k.refuse_name, k.refuse_args) if k.refuse_name else None)
                     for k in plan.kernels]
            return _with_optimizers(opts, _install_python(_select(cands, ops)))
        from . import artifact_at, library

        art = artifact_at(how.library) if how.library else \
            library(opts, plan=plan, build=how.build, prebuilt=plan is None, verbose=how.verbose)
        return _with_optimizers(opts, register(art, ops))


def _with_optimizers(opts: Options, rep: InstallReport) -> InstallReport:
    """The overlay's optimizer entries applied (runtime/optim.py), and said in the report."""
    from . import optim

    rep.optimizers = optim.activate(runtime_overlay(opts).optimizers)
    return rep


def register(artifact, ops: list[str] | None = None, backend: Backend = Backend.CPP) -> InstallReport:
    """Register the kernels of ``artifact`` (runtime.Artifact; ``ops``: a subset), from the library
    loaded from the very descriptor its checks ran on (trust.check_library)."""
    if backend != Backend.CPP:
        raise InputError(None, None, f"an artifact is a compiled library: backend '{backend}' does not load one",
                         "use install(backend='python') for the Python kernels")
    rep = _install_cpp(artifact.path, _select([Candidate(op, schema) for op, schema in artifact.kernels], ops),
                       lambda: _load(artifact.path, artifact.sha256, artifact.root, artifact.key))
    rep.prebuilt = artifact.prebuilt
    rep.prebuilt_unused = artifact.prebuilt_unused
    return rep


def _select(cands: list[Candidate], ops: list[str] | None) -> list[Candidate]:
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
    from .pykernel import make_kernel

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
    dll = load() if load else _load_built(path)
    dll.torchgen_patch_register.restype = ctypes.c_int64
    dll.torchgen_patch_register.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_int64]
    n = dll.torchgen_patch_register(_c_names([c.op.split("::", 1)[1] for c in ok]), len(ok))
    if n < 0 and -n - 1 < len(ok):
        raise InputError(path, None, f"the library has no kernel for {ok[-n - 1].op}: rebuild it")
    if n < 0:
        raise _refused_by_torch(dll, path, "torchgen_patch_error")
    for c in ok:
        _INSTALLED[c.op] = Backend.CPP
        rep.registered.append(c.op)
    return rep


def _install_python(cands: list[Candidate]) -> InstallReport:
    rep = InstallReport(Backend.PYTHON)
    ok, rep.already, rep.refused = check(cands)
    for c in ok:
        _HANDLES.append(_python_kernel(c.op, [w.name for w in c.written], refuse=c.refuse))
        _INSTALLED[c.op] = Backend.PYTHON
        rep.registered.append(c.op)
    return rep


def runtime_overlay(opts: Options):
    """The overlay's decisions about runtime operators (the shipped overlay unless told otherwise)."""
    from ..plan import overlay as ov
    from ..sources import overlay_path

    path = overlay_path(opts)
    return ov.load_runtime(path) if path else ov.empty()


def live_op(name: str):
    """What this process's registry says about ``name``, for the plan of runtime ops."""
    from ..plan import LiveOp
    from . import dispatcher as d

    schema = d.schema_of(name)
    if schema is None:
        return LiveOp(name, None, (), False, False)
    return LiveOp(name, str(schema), tuple(d.written_args(schema)), d.is_view(schema),
                  d.has_kernel(name, "ADInplaceOrView"))


def _install_runtime(todo, backend: Backend, how: InstallOptions) -> InstallReport:
    """Register the runtime plan ``todo`` (plan.RuntimePlan)."""
    global _EVIDENCE

    rep = InstallReport(backend, already=list(todo.already), refused=dict(todo.refused))
    if not todo.ops:
        return rep
    if backend == Backend.PYTHON:
        if how.evidence:
            from .pykernel import Evidence

            _EVIDENCE = _EVIDENCE or Evidence()
        for op in todo.ops:
            _HANDLES.append(_python_kernel(op.name, list(op.written), _EVIDENCE if how.evidence else None))
            _INSTALLED[op.name] = Backend.PYTHON
            rep.registered.append(op.name)
        return rep
    from .build import build_boxed

    # a prebuilt one (run's children): checked, never rebuilt
    rep.library = how.boxed_library or build_boxed(verbose=how.verbose).path
    dll = _load_built(rep.library)
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
            _INSTALLED[f"{ns}::{r}"] = "boxed"
            rep.registered.append(f"{ns}::{r}")
    return rep


def expand_patterns(names: list[str]) -> list[str]:
    """Runtime op names, with glob patterns (``"bitsandbytes::*"``, ``"fbgemm::*_update*"``)
    expanded to the mutating operators that have no ADInplaceOrView kernel and match."""
    import fnmatch

    from .registry import uncovered

    out: list[str] = []
    candidates = None
    for name in names:
        if not any(c in name for c in "*?["):
            out.append(name)
            continue
        if "::" not in name:
            raise InputError(None, None, f"runtime op pattern '{name}' needs its namespace ('ns::*')")
        if candidates is None:
            candidates = [o.name for o in uncovered()]
        # a pattern never reaches aten (the plan and its overlay decide those) or prims; name them exactly
        hits = [c for c in candidates if fnmatch.fnmatchcase(c, name) and c.split("::", 1)[0] not in ("aten", "prims")]
        if not hits:
            spaces = "namespaces that have such operators: " + (
                ", ".join(sorted({c.split("::", 1)[0] for c in candidates})) or "none")
            raise InputError(None, None, f"runtime op pattern '{name}' matches no mutating operator without an "
                                         "ADInplaceOrView kernel in this process",
                             spaces + "; import the library that defines them first", facts=spaces)
        out.extend(h for h in hits if h not in out)
    return out


def evidence():
    """What the runtime ops installed with ``evidence=True`` wrote, call by call (None if none)."""
    return _EVIDENCE


def installed_ops() -> list[str]:
    return sorted(_INSTALLED)


def uninstall() -> list[str]:
    """Remove every kernel torchgen-patch registered in this process (and turn off the saved-tensor
    check install() turned on)."""
    global _EVIDENCE
    import sys

    if "torchgen_patch.saved.hooks" in sys.modules:
        from ..saved import disable

        disable()
    with _LOCK:
        gone = sorted(_INSTALLED)
        for dll in _CDLLS.values():
            for fn in ("torchgen_patch_unregister_all", "torchgen_patch_boxed_unregister_all"):
                if hasattr(dll, fn):
                    getattr(dll, fn).restype = None
                    getattr(dll, fn)()
        from . import optim

        optim.deactivate()
        for lib in _HANDLES:
            lib._destroy()
        _HANDLES.clear()
        _INSTALLED.clear()
        _EVIDENCE = None
        return gone
