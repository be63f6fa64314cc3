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
import json
import os
import threading
from dataclasses import dataclass, field

from ..errors import EnvironmentProblem, InputError, require_torch, unknown_names
from ..sources import Options

_LOCK = threading.Lock()
_INSTALLED: dict[str, str] = {}  # op -> backend
_HANDLES: list = []  # keep libraries (ctypes handles, torch.library.Library) alive
_CDLLS: dict[str, ctypes.CDLL] = {}
_EVIDENCE = None  # pykernel.Evidence of the runtime ops installed with evidence=True


@dataclass
class InstallReport:
    backend: str
    library: str | None = None
    registered: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)  # installed earlier by torchgen-patch
    refused: dict[str, str] = field(default_factory=dict)  # op -> why
    prebuilt: str | None = None  # the installed prebuilt kernels used (their version), if any
    prebuilt_unused: str | None = None  # why installed prebuilt kernels were not used

    def summary(self) -> str:
        lines = [f"torchgen-patch install ({self.backend}): {len(self.registered)} registered, "
                 f"{len(self.already)} already active, {len(self.refused)} refused"]
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


def install(ops: list[str] | None = None, backend: str = "cpp", *, library: str | None = None,
            native_functions: str | None = None, tags: str | None = None, overlay: str | None = None,
            no_overlay: bool = False, no_cache: bool = False, runtime_ops: list[str] | None = None,
            verbose: bool = False, options: Options | None = None, plan=None,
            evidence: bool = False, boxed_library: str | None = None, build: bool = True,
            requires_grad_check: bool = True) -> InstallReport:
    """Register ADInplaceOrView kernels for the plan's ops (or ``ops``, a subset).

    ``runtime_ops``: operators of any namespace found in the live registry
    (``torchgen-patch lint --runtime``), served by one boxed kernel that reads
    their schemas at call time; given alone, only those are installed.
    Loading twice is a no-op: ops already installed are reported as such.
    ``options`` (sources.Options) replaces the input keywords when given;
    ``plan`` (plan.Plan), when given, is used instead of making one.
    ``evidence`` (runtime ops, Python backend): also record which written arguments each call
    really changed; read it with ``evidence()`` ("declared written, never changed").
    With neither ``library`` nor ``plan``, installed prebuilt kernels (``torchgen-patch wheel``)
    are used when they match this torch exactly; else the report says why not and the cached
    build is used, unless ``build=False``, which refuses instead (InputError).
    ``requires_grad_check=False``: the kernels of out= ops do not refuse arguments that require
    grad (by default they do, with PyTorch's own message, in grad mode).
    """
    opts = options or Options(native_functions, tags, None, overlay, no_overlay, no_cache, requires_grad_check)
    if backend not in ("cpp", "python"):
        raise InputError(None, None, f"unknown backend '{backend}'", "use 'cpp' or 'python'")
    if runtime_ops is not None and ops is None and library is None:
        if evidence and backend != "python":
            raise InputError(None, None, "evidence=True records in the Python kernel", "use backend='python'")
        with _LOCK:
            return _install_runtime(runtime_ops, backend, verbose, runtime_overlay(opts), evidence, boxed_library)
    with _LOCK:
        if backend == "python":
            if plan is None:
                from ..pipeline import plan as make

                _, plan = make(opts)
            cands = [Candidate(k.op, k.schema, k.written, (k.refuse_name, k.refuse_args) if k.refuse_name else None)
                     for k in plan.kernels]
            return _install_python(_select(cands, ops))
        prebuilt, unused = (None, None) if library or plan else _prebuilt(opts, build)
        if prebuilt is not None:
            rep = _install_cpp(prebuilt.library, _select([Candidate(*k) for k in prebuilt.kernels()], ops))
            rep.prebuilt = prebuilt.version
            return rep
        try:
            lib_path, cands = _library(library, opts, plan, verbose)
        except EnvironmentProblem as e:  # no compiler, say: the prebuilt kernels' reason is the useful part
            if unused is None:
                raise
            raise EnvironmentProblem(f"{e.message}; the installed prebuilt kernels were not used: {unused}",
                                     e.hint) from None
        rep = _install_cpp(lib_path, _select(cands, ops))
        rep.prebuilt_unused = unused
        return rep


def _prebuilt(opts: Options, build: bool):
    """(prebuilt kernels to use, why installed ones are not used); with ``build=False`` no usable
    prebuilt kernels is an error."""
    from .prebuilt import DIST, lookup

    found, why = lookup(opts)
    if found is None and not build:
        raise InputError(None, None, f"no usable prebuilt kernels: {why or DIST + ' is not installed'}; "
                                     "and building was ruled out (build=False, --no-build)",
                         f"pip install the {DIST} wheel made for this torch (`torchgen-patch wheel`)")
    return found, why


def _select(cands: list[Candidate], ops: list[str] | None) -> list[Candidate]:
    if ops is None:
        return cands
    by = {c.op: c for c in cands}
    unknown = [o for o in ops if o not in by]
    if unknown:
        raise unknown_names("the plan", unknown, by)
    return [by[o] for o in ops]


def _library(library, opts: Options, plan, verbose) -> tuple[str, list[Candidate]]:
    torch = require_torch("installing the kernels")
    if library is None:
        from ..codegen import render
        from .build import build

        if plan is None:
            from ..pipeline import plan as make

            _, plan = make(opts)
        lib = build(render(plan, 2), plan.ops(), 2, verbose=verbose)
        library = lib.path
    d = os.path.dirname(os.path.abspath(library))
    info = _trusted_record(library)
    try:
        with open(os.path.join(d, "src", "torchgen_patch_manifest.json")) as fh:
            manifest = json.load(fh)
    except (OSError, ValueError) as e:
        raise InputError(library, None, f"not a complete torchgen-patch build ({e})") from None
    if info.get("torch") != torch.__version__:
        raise InputError(library, None, f"built for torch {info.get('torch')}, this is torch {torch.__version__}",
                         "rebuild with `torchgen-patch build`")
    return library, [Candidate(k["op"], k["schema"]) for k in manifest["kernels"]]


def _trusted_record(library: str) -> dict:
    """The build record of ``library``, once the library passed the trust checks (trust.py):
    owned by this user (or root), writable by nobody else, the SHA-256 its build recorded."""
    from ..scan.cache import directory as cache_dir
    from . import trust
    from .build import RECORD

    d = os.path.dirname(os.path.abspath(library))
    cache = os.path.realpath(cache_dir())
    root = cache if trust.inside(os.path.realpath(d), cache) else d
    trust.check_path(d, root, library)
    record = os.path.join(d, RECORD)
    try:
        with open(record) as fh:
            info = json.load(fh)
    except (OSError, ValueError) as e:
        raise InputError(library, None, f"not a complete torchgen-patch build ({e})") from None
    trust.check_path(record, root, library)
    trust.check_library(library, info.get("sha256") if isinstance(info, dict) else None, root)
    return info


def _dll(path: str) -> ctypes.CDLL:
    """The library at ``path``, loaded once (loading registers nothing by itself)."""
    dll = _CDLLS.get(path)
    if dll is None:
        dll = ctypes.CDLL(path)
        _CDLLS[path] = dll
    return dll


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


def _install_cpp(path: str, cands: list[Candidate]) -> InstallReport:
    rep = InstallReport("cpp", library=path)
    ok, rep.already, rep.refused = check(cands)
    if not ok:
        return rep
    dll = _dll(path)
    dll.torchgen_patch_register.restype = ctypes.c_int64
    dll.torchgen_patch_register.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_int64]
    n = dll.torchgen_patch_register(_c_names([c.op.split("::", 1)[1] for c in ok]), len(ok))
    if n < 0:
        raise InputError(path, None, f"the library has no kernel for {ok[-n - 1].op}: rebuild it")
    for c in ok:
        _INSTALLED[c.op] = "cpp"
        rep.registered.append(c.op)
    return rep


def _install_python(cands: list[Candidate]) -> InstallReport:
    rep = InstallReport("python")
    ok, rep.already, rep.refused = check(cands)
    for c in ok:
        _HANDLES.append(_python_kernel(c.op, [w.name for w in c.written], refuse=c.refuse))
        _INSTALLED[c.op] = "python"
        rep.registered.append(c.op)
    return rep


def runtime_overlay(opts: Options):
    """The overlay's decisions about runtime operators (the shipped overlay unless told otherwise)."""
    from ..plan import overlay as ov
    from ..sources import overlay_path

    path = overlay_path(opts)
    return ov.load_runtime(path) if path else ov.empty()


def _install_runtime(names: list[str], backend: str, verbose: bool, overlay, evidence: bool = False,
                     boxed_library: str | None = None) -> InstallReport:
    global _EVIDENCE
    from . import dispatcher as d

    rep = InstallReport(backend)
    todo = []
    for name in expand_patterns(names):
        if "::" not in name:
            raise InputError(None, None, f"runtime op '{name}' needs its namespace ('ns::op.overload')")
        entry = overlay.get(name)
        if entry is not None and entry.action == "skip":
            rep.refused[name] = f"skipped by the overlay ({os.path.basename(overlay.path)}:{entry.line}): " \
                                f"{entry.reason}"
            continue
        if name in _INSTALLED:
            rep.already.append(name)
            continue
        schema = d.schema_of(name)
        if schema is None:
            rep.refused[name] = "this process has no such operator (import the module that defines it first)"
        elif not d.written_args(schema):
            rep.refused[name] = "its schema writes no argument"
        elif d.is_view(schema):
            rep.refused[name] = "a view: its kernel must set up the view, which this one does not"
        elif d.has_kernel(name, "ADInplaceOrView"):
            rep.refused[name] = "already has an ADInplaceOrView kernel"
        else:
            todo.append((name, schema))
    if not todo:
        return rep
    if backend == "python":
        if evidence:
            from .pykernel import Evidence

            _EVIDENCE = _EVIDENCE or Evidence()
        for name, schema in todo:
            _HANDLES.append(_python_kernel(name, list(d.written_args(schema)), _EVIDENCE if evidence else None))
            _INSTALLED[name] = "python"
            rep.registered.append(name)
        return rep
    from .build import build_boxed

    rep.library = boxed_library or build_boxed(verbose=verbose).path  # a prebuilt one (run): checked, never rebuilt
    _trusted_record(rep.library)
    dll = _dll(rep.library)
    dll.torchgen_patch_boxed_register.restype = ctypes.c_int64
    dll.torchgen_patch_boxed_register.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_int64]
    by_ns: dict[str, list[str]] = {}
    for name, _ in todo:
        ns, rest = name.split("::", 1)
        by_ns.setdefault(ns, []).append(rest)
    for ns, rests in sorted(by_ns.items()):
        dll.torchgen_patch_boxed_register(ns.encode(), _c_names(rests), len(rests))
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
            spaces = sorted({c.split("::", 1)[0] for c in candidates})
            raise InputError(None, None, f"runtime op pattern '{name}' matches no mutating operator without an "
                                         "ADInplaceOrView kernel in this process",
                             "namespaces that have such operators: " + (", ".join(spaces) or "none")
                             + "; import the library that defines them first")
        out.extend(h for h in hits if h not in out)
    return out


def evidence():
    """What the runtime ops installed with ``evidence=True`` wrote, call by call (None if none)."""
    return _EVIDENCE


def installed_ops() -> list[str]:
    return sorted(_INSTALLED)


def uninstall() -> list[str]:
    """Remove every kernel torchgen-patch registered in this process."""
    global _EVIDENCE
    with _LOCK:
        gone = sorted(_INSTALLED)
        for dll in _CDLLS.values():
            for fn in ("torchgen_patch_unregister_all", "torchgen_patch_boxed_unregister_all"):
                if hasattr(dll, fn):
                    getattr(dll, fn).restype = None
                    getattr(dll, fn)()
        for lib in _HANDLES:
            lib._destroy()
        _HANDLES.clear()
        _INSTALLED.clear()
        _EVIDENCE = None
        return gone
