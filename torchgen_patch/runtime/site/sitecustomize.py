# torchgen-patch run: this directory is put first on PYTHONPATH of the program it runs. At
# interpreter start it only adds a finder that waits for the program's own first `import torch`
# (and for the modules of --import); the kernels are installed right after torch has finished
# importing, so whatever the program set
# before that import (OMP_NUM_THREADS, TORCH_* variables, ...) is seen by torch as without `run`.
# A process that never imports torch is left alone. The next sitecustomize on the path (the
# user's or the environment's) runs after this one, as it would have without `run`.
# What to install comes from $TORCHGEN_PATCH_RUN (torchgen_patch/runtime/launch.py).
import sys as _tgp_sys


def _tgp_after(name):
    """Called once per watched module, right after it finished importing; never breaks the
    program's import."""
    try:
        try:
            from torchgen_patch.runtime.launch import after_import
        except ImportError:  # torchgen-patch lives elsewhere than this program's path: at the end of it
            import json
            import os

            _tgp_sys.path.append(json.loads(os.environ["TORCHGEN_PATCH_RUN"])["package"])
            from torchgen_patch.runtime.launch import after_import
    except Exception as e:  # noqa: BLE001 — report; the program goes on unpatched, and says so
        print(f"torchgen-patch: NOT active: {type(e).__name__}: {e}", file=_tgp_sys.stderr, flush=True)
        return
    after_import(name)


def _tgp_watched():
    """torch, and the modules of --import (their operators exist once they finished importing)."""
    import json
    import os

    try:
        return {"torch", *json.loads(os.environ["TORCHGEN_PATCH_RUN"]).get("imports", [])}
    except (KeyError, ValueError, TypeError):
        return {"torch"}


class _TgpFinder:
    """A meta-path finder that answers for the watched modules only: it lets the other finders find
    the module, then wraps that loader's exec_module (on this one loader object) to call _tgp_after
    when the module has run. A module counts as seen only once its module really ran: a spec asked
    for and thrown away (importlib.util.find_spec("torch"), as libraries do to see whether torch is
    there) leaves it watched."""

    watched = set()

    @classmethod
    def _ran(cls, name):
        cls.watched.discard(name)
        if not cls.watched and cls in _tgp_sys.meta_path:
            _tgp_sys.meta_path.remove(cls)

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name not in cls.watched:
            return None
        for finder in list(_tgp_sys.meta_path):
            find = None if finder is cls else getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is not None and hasattr(loader, "exec_module"):
            run_module = loader.exec_module

            def exec_module(module):
                run_module(module)
                _TgpFinder._ran(name)
                _tgp_after(name)

            loader.exec_module = exec_module
        return spec


def _tgp_chain():
    """Run the next sitecustomize on sys.path, if any; its errors are its own (site reports them
    exactly as it would have without `run`)."""
    import importlib.machinery
    import importlib.util
    import os

    ours = os.path.dirname(os.path.realpath(__file__))
    rest = [p for p in _tgp_sys.path if os.path.realpath(p or ".") != ours]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and os.path.dirname(os.path.realpath(spec.origin)) != ours:
        module = importlib.util.module_from_spec(spec)
        _tgp_sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


if not getattr(_tgp_sys, "_torchgen_patch_site", False):  # a second copy of this folder on the path: once
    _tgp_sys._torchgen_patch_site = True
    _TgpFinder.watched = {m for m in _tgp_watched() if m not in _tgp_sys.modules}
    if "torch" in _tgp_sys.modules:  # imported before site ran (an embedding program): install now
        _tgp_after("torch")
    if _TgpFinder.watched:
        _tgp_sys.meta_path.insert(0, _TgpFinder)
    _tgp_chain()
