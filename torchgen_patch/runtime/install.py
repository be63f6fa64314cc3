"""Install: the Python API's one call, ``install()``: the kernels of the plan (or a library, or
live-registry operators) registered into the running torch, the overlay's optimizer entries applied,
and the saved-tensor check turned on where asked.

Two backends share the plan, the refusals and the exactly-one-bump rule: ``cpp`` (the compiled
library, the default: ``runtime.library`` builds it, ``load.register`` registers it) and ``python``
(torch.library kernels, for machines without a compiler). What is registered is ``load.REGISTRY``'s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..errors import InputError, descriptors_said
from ..sources import Options
from ..vocabulary import Backend, CheckMode
from .load import REGISTRY, Candidate, InstallReport, register, register_python, register_runtime, select


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
    check_every: int = 1  # the check sampled: each step checked with probability 1/check_every (saved/sample.py)
    check_quiet: bool = False  # the check does not say it is on (run -q)
    saved_library: str | None = None  # a build of the check's native hooks (run's children): checked, never rebuilt


def install(ops: list[str] | None = None, backend: Backend = Backend.CPP, *, options: Options | None = None,
            plan=None, how: InstallOptions | None = None, **keywords: Any) -> InstallReport:
    """Register ADInplaceOrView kernels for the plan's ops (or ``ops``, a subset), with ``backend``
    (``"cpp"``: the compiled library; ``"python"``: torch.library kernels, no compiler needed).

    ``keywords``: the fields of the two values below, each as a keyword of its own (``keyword_forms``);
    any other keyword is refused (TypeError), as Python refuses one.

    The inputs: ``options`` (sources.Options), or its fields as keywords: ``native_functions``,
    ``tags`` (the yaml files), ``overlay`` / ``no_overlay`` (another overlay, or none),
    ``no_cache`` (scan afresh), ``requires_grad_check`` (False: the kernels of out= ops do not
    refuse arguments that require grad; by default they do, with PyTorch's own message, in grad mode).
    ``plan`` (plan.Plan), when given, is used instead of making one.

    How it works: ``how`` (InstallOptions), or its fields as keywords (not both):
    ``library``: a torchgen-patch build to load. With neither ``library`` nor ``plan``, installed
    prebuilt kernels (``torchgen-patch wheel``) are used when they match this torch exactly; else the
    report says why not and the cached build is used, unless ``build`` is False, which refuses instead
    (InputError). ``runtime_ops``: operators of any namespace found in the live registry
    (``torchgen-patch lint --runtime``; names or ``ns::*`` patterns), served by one boxed kernel
    that reads their schemas at call time; given alone, only those are installed. ``evidence``
    (runtime ops, Python backend): also record which written arguments each call really changed;
    read it with ``evidence()``. ``boxed_library`` / ``saved_library``: a build of the boxed kernel
    or of the check's native hooks to check and load, never rebuilt. ``verbose``: the compiler's
    output. ``check_saved`` (``"warn"`` or ``"raise"``): also turn on the saved-tensor check for the
    rest of the process (``torchgen_patch.check_saved``); any other value is refused (ValueError)
    before anything is built. ``check_every``: the check sampled, each backward pass's forward checked
    with probability 1/``check_every`` (1, the default: every step; ``saved.sample.DEFAULT_EVERY`` is what
    a training run is advised; anything but a whole number >= 1: ValueError before anything is built);
    ``check_quiet``: the check does not say it is on (its findings and its count at exit it still says).

    Loading twice is a no-op: ops already installed are reported as such. The overlay's optimizer
    entries (``optimizers:``) are applied too, through PyTorch's global optimizer step hooks
    (runtime/optim.py); the report lists them (``optimizers``).
    """
    opts, how = keyword_forms(options, how, keywords)
    with descriptors_said():  # no free descriptor, at an open or at a lazy import: one line, exit 3
        saved = None
        if how.check_saved is not None:  # the stage imported only for it (a plain install() stays light)
            from .. import saved  # type: ignore[assignment]  # the module, or None when not asked
        mode = None if saved is None else saved.mode_of(how.check_saved)  # refused before anything is built
        every = 1 if saved is None else saved.every_of(how.check_every)
        rep = _install(ops, backend, opts, plan, how)
        if mode is not None:
            rep.check_saved = _start_check(saved, mode, every, how)
    return rep


def _start_check(saved, mode, every: int, how: InstallOptions):
    """The saved-tensor check on for the rest of the process; its mode. A sampled check (``every`` > 1, as
    run and enable turn it on by default) starts at the end of the first backward pass (``saved/later.py``:
    a process that runs none pays for nothing else), never compiles the native hooks in the program's
    process (where none are built, its drawn steps run the Python hooks) and never stops the program: where
    it cannot start, one line says why then, and the kernels stay."""
    def ready(build: bool) -> None:
        from .checklib import prepare  # here: a process that never runs backward never imports it

        prepare(library=how.saved_library, build=build)

    if every == 1:
        ready(how.build)
        return saved.enable(mode, every=every, quiet=how.check_quiet).mode
    saved.enable_at_first_backward(mode, every, how.check_quiet, lambda: ready(False))
    return mode


# the keyword forms: Options' fields but a checkout's root (the kernels serve the running torch; a tree
# is given whole in options=, as the CLI's --pytorch-root gives it), and InstallOptions' fields
OPTION_KEYWORDS = tuple(f.name for f in dataclasses.fields(Options) if f.name != "pytorch_root")
HOW_KEYWORDS = tuple(f.name for f in dataclasses.fields(InstallOptions))


def keyword_forms(options: Options | None, how: InstallOptions | None,
                  keywords: dict) -> tuple[Options, InstallOptions]:
    """``install()``'s keyword forms, in one place: each keyword a field of ``Options`` (``pytorch_root``
    aside) or of ``InstallOptions``, made into those two values (``options`` and ``how`` where given,
    never both a value and its fields: TypeError); any other keyword is refused (TypeError)."""
    unknown = sorted(set(keywords) - set(OPTION_KEYWORDS) - set(HOW_KEYWORDS))
    if unknown:
        raise TypeError(f"install() got an unexpected keyword argument {unknown[0]!r}")
    return (_merged(Options, options, "options", {k: keywords[k] for k in OPTION_KEYWORDS if k in keywords}),
            _merged(InstallOptions, how, "how", {k: keywords[k] for k in HOW_KEYWORDS if k in keywords}))


def _merged(kind, value, name: str, keywords: dict):
    """``value`` (a ``kind``), or one made of the ``keywords`` (those the caller gave): never both (a
    TypeError names them, a keyword at its default value too: it would be dropped without a word)."""
    if value is None:
        return dataclasses.replace(kind(), **keywords)
    if keywords:
        raise TypeError(f"install() got {name}= and {', '.join(sorted(keywords))}: give them in {name}= or as "
                        "keywords, not both")
    return value


def _install(ops, backend: Backend, opts: Options, plan, how: InstallOptions) -> InstallReport:
    try:
        backend = Backend.parse(backend)
    except ValueError:
        raise InputError(None, None, f"unknown backend '{backend}'", "use 'cpp' or 'python'") from None
    if how.runtime_ops is not None and ops is None and how.library is None:
        if how.evidence and backend != Backend.PYTHON:
            raise InputError(None, None, "evidence=True records in the Python kernel", "use backend='python'")
        from ..plan import plan_runtime

        with REGISTRY.lock:
            todo = plan_runtime(expand_patterns(list(how.runtime_ops)), runtime_overlay(opts), live_op,
                                set(REGISTRY.installed))
            return _with_optimizers(opts, register_runtime(todo, backend, how.evidence, how.boxed_library, how.verbose))
    with REGISTRY.lock:
        if backend == Backend.PYTHON:
            if plan is None:
                from ..pipeline import plan as make

                _, plan = make(opts)
            cands = [Candidate(k.op, k.schema, k.written, (k.refuse_name, k.refuse_args) if k.refuse_name else None)
                     for k in plan.kernels]
            return _with_optimizers(opts, register_python(select(cands, ops)))
        from . import artifact_at, library

        art = artifact_at(how.library) if how.library else \
            library(opts, plan=plan, build=how.build, prebuilt=plan is None, verbose=how.verbose)
        return _with_optimizers(opts, register(art, ops))


def _with_optimizers(opts: Options, rep: InstallReport) -> InstallReport:
    """The overlay's optimizer entries applied (runtime/optim.py), and said in the report."""
    from . import optim

    rep.optimizers = optim.activate(runtime_overlay(opts).optimizers)
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
