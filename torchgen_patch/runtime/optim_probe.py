"""The probe behind ``lint --runtime --import MOD``'s optimizer rule: every optimizer class that
MOD (and the submodules of it that are imported) defines gets a probe step on a tiny parameter —
constructed with its defaults (and the common values of ``PROBE_VALUES`` for the hyperparameters
it has no default for), given a gradient, its version and bits taken, stepped, compared. Where
construction or a step fails with a default that switches a feature off (``momentum=0``: SGD and
LARS that refuse to run without momentum), the probe tries once more with that feature on
(``SWITCHED_ON``). A step that changes the bits and not the version writes where autograd cannot
see; a class that cannot be constructed or stepped is said so with the reason (its defaults'), and
one an optimizer entry of the overlay covers is reported as covered, not probed.

For a write that moved no version, a second probe under a recording dispatch mode says how it was
made: through an operator without an ``ADInplaceOrView`` kernel (``install(runtime_ops=...)``
serves it), through an operator on an alias whose version counter is its own (``p.data``), or
outside the dispatcher (C++ bound with pybind, ``data_ptr``, numpy): the last two need an entry."""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from dataclasses import dataclass, replace

from ..errors import Location, one_line
from ..vocabulary import StepOutcome, plural
from .optim import covering

STEPS = 3  # probe steps before a class counts as changing nothing (some skip their first steps)
SHAPE = (8, 8)
# what the probe gives a hyperparameter the constructor has no default for (torch's optimizers' values)
PROBE_VALUES = {"lr": 1e-3, "momentum": 0.9, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
                "amsgrad": False}
# hyperparameters whose default switches their feature off (0, None): given PROBE_VALUES' value on a
# second attempt where the defaults fail to construct or step
SWITCHED_ON = ("momentum", "betas")


@dataclass(frozen=True)
class StepProbe:
    """One optimizer class's probe."""

    cls: str  # module.Class
    loc: Location  # where the class is defined
    outcome: StepOutcome
    detail: str = ""  # why it was not run; how an unseen write was made; the entry that covers it
    through: tuple[str, ...] = ()  # operators without an ADInplaceOrView kernel that wrote the parameter
    given: tuple[str, ...] = ()  # the keyword arguments the probe constructed it with, as name=value


def probe_modules(modules: list[str], entries: dict) -> list[StepProbe]:
    """Probe every optimizer class defined in ``modules`` (already imported) and their imported
    submodules; ``entries``: the overlay's optimizer entries (class path -> OptimizerEntry)."""
    classes = optimizer_classes(modules)
    if not classes:
        return []
    import warnings

    with _stdout_to_stderr(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probes = [probe(c, covering(entries, c)) for c in classes]
    return [_as_base(p, c, classes) for p, c in zip(probes, classes, strict=True)]


def _as_base(p: StepProbe, cls: type, classes: list[type]) -> StepProbe:
    """A class not probed that classes probed here derive from says so: often a base class that
    needs what only its subclasses give (bitsandbytes' Optimizer1State, its ``optimizer_name``)."""
    n = sum(1 for c in classes if c is not cls and issubclass(c, cls))
    if p.outcome != StepOutcome.NOT_RUN or not n:
        return p
    return replace(p, detail=f"{p.detail} ({plural(n, 'class', 'classes')} probed here derive"
                             f"{'s' if n == 1 else ''} from it)")


def unknown_entries(entries: dict) -> list[tuple]:
    """The optimizer entries (class path -> OptimizerEntry) whose module is imported and names no
    subclass of torch.optim.Optimizer under the entry's name: (entry, what the name is there). An
    entry of a module not imported is not looked at (importing it is the program's choice)."""
    import torch

    out = []
    for path, e in sorted(entries.items()):
        module, _, name = path.rpartition(".")
        if module not in sys.modules:
            continue
        obj = getattr(sys.modules[module], name, None)
        if obj is None:
            out.append((e, f"nothing: {module} has no {name}"))
        elif not (isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer)):
            out.append((e, f"a {type(obj).__name__} of {module}, not an optimizer class"))
    return out


def optimizer_classes(modules: list[str]) -> list[type]:
    """The subclasses of torch.optim.Optimizer defined in ``modules`` or their imported submodules,
    sorted by path."""
    import warnings

    import torch

    base, found = torch.optim.Optimizer, {}
    with warnings.catch_warnings():  # a deprecated name looked at (torch.distributed.reduce_op) is not the user's
        warnings.simplefilter("ignore")
        for name in sorted(sys.modules):
            if not any(name == m or name.startswith(m + ".") for m in modules):
                continue
            for obj in list(getattr(sys.modules.get(name), "__dict__", {}).values()):
                try:
                    if isinstance(obj, type) and issubclass(obj, base) and obj is not base and obj.__module__ == name:
                        found[path_of(obj)] = obj
                except TypeError:  # a class whose metaclass refuses issubclass
                    continue
    return [found[k] for k in sorted(found)]


def path_of(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def probe(cls: type, entry=None) -> StepProbe:
    """``cls``'s probe (``entry``: the overlay entry that covers it, if any: then it is not run)."""
    path, loc = path_of(cls), _where(cls)
    if entry is not None:
        return StepProbe(path, loc, StepOutcome.COVERED, f"overlay entry at line {entry.line}")
    if inspect.isabstract(cls):
        return StepProbe(path, loc, StepOutcome.NOT_RUN, "an abstract class")
    import torch

    failed = []  # why each attempt failed: the defaults', then the one with SWITCHED_ON features on
    with torch.random.fork_rng(devices=[]):
        for kw in attempts(cls):
            torch.manual_seed(0)
            try:
                opt, p = construct(cls, kw)
            except Exception as e:  # noqa: BLE001 — the library's own error, reported as the reason
                failed.append((kw, f"could not be constructed: {_error(e)}"))
                continue
            if "step" in vars(opt):  # a step bound per instance: torch's hooks wrap the class's only
                return StepProbe(path, loc, StepOutcome.NOT_RUN, "its instances replace step() with a method "
                                                                 "PyTorch's optimizer step hooks do not wrap, so no "
                                                                 "overlay entry can cover it")
            try:
                changed, moved = _steps(opt, p)
            except Exception as e:  # noqa: BLE001 — the library's own error, reported as the reason
                failed.append((kw, f"its step raised {_error(e)}"))
                continue
            given = _given(kw)
            if not changed:
                return StepProbe(path, loc, StepOutcome.UNCHANGED, f"{STEPS} probe steps changed no parameter",
                                 given=given)
            if moved:
                return StepProbe(path, loc, StepOutcome.BUMPS, given=given)
            how, through = _how(cls, kw)
            return StepProbe(path, loc, StepOutcome.UNSEEN, how, through, given)
    reason = failed[0][1] + "".join(f"; with {', '.join(_given(kw))}: {why}" for kw, why in failed[1:])
    return StepProbe(path, loc, StepOutcome.NOT_RUN, reason)


def attempts(cls) -> list[dict]:
    """The keyword arguments of each construction the probe tries, in order: PROBE_VALUES' value
    for each hyperparameter without a default; then, if the class has any SWITCHED_ON
    hyperparameter whose default is off, the same with those switched on."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return [{}]
    first = {n: PROBE_VALUES[n] for n, a in params.items() if n in PROBE_VALUES and _no_default(a)}
    on = {n: PROBE_VALUES[n] for n in SWITCHED_ON if n in params and n not in first and _off(params[n].default)}
    return [first, {**first, **on}] if on else [first]


def _off(default) -> bool:
    """A default that switches its feature off: None, (), 0 (never a tensor's truth value)."""
    return default is None or (type(default) is tuple and not default) or (type(default) in (int, float)
                                                                          and default == 0)


def _no_default(a: inspect.Parameter) -> bool:
    return a.default is inspect.Parameter.empty or type(a.default).__name__ == "_RequiredParameter"  # torch's


def construct(cls, kw: dict):
    """``cls`` on a tiny parameter, with the keyword arguments ``kw``: (the optimizer, the parameter).
    The parameters go by name where the constructor names them ``params`` (a class whose first
    argument is another one then says what it misses), else first."""
    import torch

    p = torch.nn.Parameter(torch.randn(*SHAPE))
    try:
        named = inspect.signature(cls).parameters.get("params")
    except (TypeError, ValueError):
        named = None
    if named is not None and named.kind in (named.POSITIONAL_OR_KEYWORD, named.KEYWORD_ONLY):
        return cls(params=[p], **kw), p
    return cls([p], **kw), p


def _given(kw: dict) -> tuple[str, ...]:
    return tuple(f"{k}={v!r}" for k, v in kw.items())


def _steps(opt, p) -> tuple[bool, bool]:
    """(whether a probe step changed the parameter's bits, whether its version moved in that step)."""
    import torch

    closure = None
    try:
        c = inspect.signature(opt.step).parameters.get("closure")
        if c is not None and c.default is inspect.Parameter.empty:  # LBFGS and the like

            def closure():
                with torch.enable_grad():
                    opt.zero_grad()
                    loss = (p * p).sum()
                    loss.backward()
                return loss
    except (TypeError, ValueError):
        pass
    for _ in range(STEPS):
        p.grad = torch.randn(*SHAPE)
        version, before = p._version, p.detach().clone()
        opt.step() if closure is None else opt.step(closure)
        if not torch.equal(before.view(torch.int32), p.detach().view(torch.int32)):
            return True, p._version != version
    return False, False


def _how(cls, kw: dict) -> tuple[str, tuple[str, ...]]:
    """How an unseen write is made: a second probe step with the dispatcher's writes recorded."""
    import torch

    from . import dispatcher

    torch.manual_seed(0)
    try:
        opt, p = construct(cls, kw)
        with _recorder(p) as rec:
            _steps(opt, p)
    except Exception as e:  # noqa: BLE001 — the library's own error, reported as the reason
        return f"how it writes is not known (its step under a recording dispatch mode raised {_error(e)})", ()
    without = tuple(sorted(op for op in rec.ops if not dispatcher.has_kernel(op, "ADInplaceOrView")))
    if without:
        return f"it writes the parameter through {', '.join(without)}, which has no ADInplaceOrView kernel", without
    if rec.ops:
        return (f"it writes the parameter through {', '.join(sorted(rec.ops))} on an alias whose version counter "
                "is its own (p.data)"), ()
    return "it writes the parameter outside the dispatcher (C++ bound with pybind, data_ptr, numpy)", ()


def _recorder(p):
    """A dispatch mode that records the operators writing a tensor that shares ``p``'s storage."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ptr, self.ops = _storage(p), set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            for i, a in enumerate(func._schema.arguments):
                if a.alias_info is not None and a.alias_info.is_write:
                    value = args[i] if i < len(args) else kwargs.get(a.name)
                    if any(_storage(t) == self.ptr for t in (value if isinstance(value, (list, tuple)) else [value])):
                        self.ops.add(func.name())
            return func(*args, **kwargs)

    return Recorder()


def _storage(t):
    try:
        return t.untyped_storage().data_ptr()
    except (AttributeError, RuntimeError, NotImplementedError):  # None, a number, a sparse tensor
        return None


def _where(cls) -> Location:
    try:
        return Location(inspect.getsourcefile(cls), inspect.getsourcelines(cls)[1])
    except (OSError, TypeError):
        return Location(None, None)


def _error(e: BaseException) -> str:
    return (type(e).__name__ + (f": {one_line(str(e))}" if str(e).strip() else ""))[:300]


@contextlib.contextmanager
def _stdout_to_stderr():
    """What the probed classes print, in Python or in C (printf), goes to stderr: stdout carries the report."""
    import ctypes

    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        try:
            ctypes.CDLL(None).fflush(None)
        except (OSError, AttributeError):
            pass
        os.dup2(saved, 1)
        os.close(saved)


def on_the_accelerator(probes: list[StepProbe], modules: list[str]) -> list[StepProbe]:
    """``probes`` (``probe_modules(modules, ...)``), where a CUDA device is present with each class a
    CPU parameter could not probe probed again on a CUDA one: DeepSpeed's FusedAdam, FusedLamb and
    FusedLion step CUDA tensors only. A class the second probe can tell about gets that outcome, which
    says where it was probed; any other keeps its CPU one, word for word."""
    device = _accelerator()
    if device is None or not any(p.outcome == StepOutcome.NOT_RUN for p in probes):
        return probes
    import warnings
    from dataclasses import replace

    import torch

    classes = {path_of(c): c for c in optimizer_classes(modules)}
    out = []
    with _stdout_to_stderr(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for p in probes:
            cls = classes.get(p.cls) if p.outcome == StepOutcome.NOT_RUN else None
            again = None
            if cls is not None and not inspect.isabstract(cls):
                with torch.device(device):  # the probe's parameter and gradients are made there
                    again = probe(cls)
            if again is None or again.outcome == StepOutcome.NOT_RUN:
                out.append(p)
                continue
            where = f"probed on a {device.upper()} parameter; on a CPU one: {p.detail}"
            out.append(replace(again, detail=f"{again.detail} ({where})" if again.detail else where))
    return out


def _accelerator() -> str | None:
    """The device a class that cannot step CPU tensors is probed on: CUDA, where present."""
    import torch

    return "cuda" if torch.cuda.is_available() else None
