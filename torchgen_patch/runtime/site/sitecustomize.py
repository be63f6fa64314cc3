# torchgen-patch run: this directory is put first on PYTHONPATH of the program it runs. At
# interpreter start it loads the hook beside it (_torchgen_patch_hook.py: a finder that waits for
# the program's own first `import torch`, and an audit hook that watches the processes this one
# starts), then takes this directory off sys.path, so the program's path is what it would be without
# `run` (its children still get it: PYTHONPATH is unchanged). The kernels are installed right after
# torch has finished importing, so whatever the program set before that import (OMP_NUM_THREADS,
# TORCH_* variables, ...) is seen by torch as without `run`; a process that never imports torch is
# left alone. The next sitecustomize on the path (the user's or the environment's) runs after this
# one, as it would have without `run`. What to install comes from $TORCHGEN_PATCH_RUN
# (torchgen_patch/runtime/launch/launcher.py).
import sys as _tgp_sys


def _tgp_start(here):
    """Load and start the hook; never breaks the interpreter's start (a hook that cannot load says so)."""
    import os

    try:
        hook = _tgp_sys.modules.get("_torchgen_patch_hook")
        if hook is None:
            _tgp_sys.path.insert(0, here)
            try:
                import _torchgen_patch_hook as hook  # type: ignore[no-redef]  # the hook beside this file
            finally:
                del _tgp_sys.path[0]
        hook.start(os.environ.get("TORCHGEN_PATCH_RUN", ""), "run")  # type: ignore[union-attr]  # imported above
    except Exception as e:  # noqa: BLE001 — the program goes on unpatched, and says so
        try:
            _tgp_sys.stderr.write(f"torchgen-patch: NOT active in pid {os.getpid()}: its hook did not load: "
                                  f"{type(e).__name__}: {e}\n")
        except Exception:  # noqa: BLE001 — stderr closed or not a stream: nowhere to say it
            pass


def _tgp_chain(here):
    """Run the next sitecustomize on sys.path, if any; its errors are its own (site reports them
    exactly as it would have without `run`)."""
    import importlib.machinery
    import importlib.util
    import os

    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _tgp_sys.path)
    if spec is not None and spec.loader is not None and spec.origin is not None \
            and os.path.dirname(os.path.realpath(spec.origin)) != here:
        module = importlib.util.module_from_spec(spec)
        _tgp_sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


def _tgp_main():
    import os

    here = os.path.dirname(os.path.realpath(__file__))
    _tgp_sys.path[:] = [p for p in _tgp_sys.path if not p or os.path.realpath(p) != here]  # off the program's path
    if not getattr(_tgp_sys, "_torchgen_patch_site", False):  # a second copy of this folder on the path: once
        _tgp_sys._torchgen_patch_site = True  # type: ignore[attr-defined]  # a mark of this process's own
        _tgp_start(here)
    _tgp_chain(here)


_tgp_main()
