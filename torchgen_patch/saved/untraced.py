"""The check's frames run as they are under torch.compile, never traced.

A function compiled whole with its ``loss.backward()`` inside leaves Dynamo's frame evaluation on while
backward runs (the call is a graph break Dynamo runs eagerly), so every Python frame entered meanwhile
is offered to Dynamo: the check's unpack hooks, its callbacks at the end of each backward pass, the
sampled check's draw and the first pass's start. Dynamo would trace them (and fails on the
fingerprint's numpy code, stopping the program). Dynamo's skip list (``torch._dynamo.trace_rules.add``)
takes a package whose frames it runs as they are, a frame and every frame it calls; this package is put
there as soon as a check exists and Dynamo is loaded, whichever comes second. Dynamo is never imported
here (it costs most of a second): where it is not loaded yet, one finder on ``sys.meta_path`` waits for
its rules module and removes itself once that is loaded (or, where another thread had found it
already, at the first import after it ran)."""

from __future__ import annotations

import importlib.abc
import sys
import threading

RULES = "torch._dynamo.trace_rules"
PACKAGE = __name__.split(".")[0]
_DONE: list = []  # the rules module this package was added to
_LOCK = threading.Lock()


def ensure() -> None:
    """This package in Dynamo's skip list now (Dynamo loaded), or as soon as Dynamo loads its rules."""
    if _DONE:
        return
    rules = sys.modules.get(RULES)
    if _loaded(rules):
        _skip(rules)
        return
    with _LOCK:
        if not any(isinstance(f, _AfterRules) for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterRules())


def _loaded(rules) -> bool:
    """Whether ``rules`` is Dynamo's rules module run to its end (not still importing what it needs, in
    another thread: most of its half second)."""
    return rules is not None and getattr(rules, "SKIP_DIRS", None) is not None and \
        not getattr(getattr(rules, "__spec__", None), "_initializing", False)


def _skip(rules) -> None:
    """Add this package to ``rules``'s skip list, once (a torch without ``add``: nothing to do)."""
    with _LOCK:
        if _DONE:
            return
        add = getattr(rules, "add", None)
        try:
            if add is not None:
                add(PACKAGE)
        except Exception:  # noqa: BLE001 — never Dynamo's own import made to fail: the frames are traced, as before
            pass
        _DONE.append(rules)


class _AfterRules(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for Dynamo's rules module, it hands on the spec the other finders give, its
    loader wrapped so that the package is added once the module has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname != RULES:
            rules = sys.modules.get(RULES)
            if rules is not None and _loaded(rules):  # found before this finder came (another thread): add it now
                self._leave()
                _skip(rules)
            return None
        self._leave()
        spec = None
        for finder in list(sys.meta_path):  # as the import system would have asked them
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Then(spec.loader)
        return spec

    def _leave(self) -> None:
        with _LOCK:
            if self in sys.meta_path:
                sys.meta_path.remove(self)


class _Then(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = module.__spec__.loader = self.loader  # the module as its own loader left it
        self.loader.exec_module(module)
        _skip(module)

    def __getattr__(self, name):  # what else the import system or linecache asks of a loader
        return getattr(self.loader, name)
