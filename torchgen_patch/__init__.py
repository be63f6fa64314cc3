"""torchgen-patch: ADInplaceOrView (version-counter) kernels for the PyTorch
ops that mutate arguments and return nothing."""

from .errors import descriptors_said
from .version import __version__
from .vocabulary import CheckMode

__all__ = ["__version__", "check_saved", "evidence", "install", "installed_ops", "uninstall"]


def __getattr__(name: str):
    """``install`` is ``runtime.install.install`` itself (its own signature and documentation),
    imported when first named, so ``import torchgen_patch`` stays light."""
    if name != "install":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with descriptors_said():  # a process out of descriptors: one EnvironmentProblem, whichever open met it
        from .runtime.install import install

    globals()["install"] = install
    return install


def installed_ops():
    from .runtime.load import installed_ops as _installed

    return _installed()


def uninstall():
    from .runtime.load import uninstall as _uninstall

    return _uninstall()


def evidence():
    """Per runtime op and written argument, calls and calls that changed it (``install(evidence=True)``)."""
    from .runtime.load import evidence as _evidence

    return _evidence()


def check_saved(mode=CheckMode.WARN, path=None, every=1, findings=None):
    """A check of every tensor autograd saves for backward: a write that changed its contents without
    moving its version is a finding (``mode="warn"``: one line each on stderr; ``"raise"``: an
    exception). A context manager (``with torchgen_patch.check_saved("raise"):``), or for the rest
    of the process: ``torchgen_patch.check_saved("warn").start()``. Any other mode: ValueError.
    ``path``: ``"native"`` (C++ hooks, built once and cached like the kernels), ``"python"``, or None
    (default, also $TORCHGEN_PATCH_CHECK_PATH): native where they can be built, else Python.
    ``every``: sampled by step: each backward pass's forward is checked with probability 1/every, drawn
    afresh after each backward pass from a generator no program can predict, and a step not drawn has
    no hooks at all (1, the default: every step; ``torchgen_patch.saved.DEFAULT_EVERY`` for training runs).
    ``findings``: a folder (default $TORCHGEN_PATCH_FINDINGS) where each finding is also one JSON line
    of this process's own file, for ``torchgen-patch findings DIR`` to group across processes."""
    from .saved import check_saved as _check
    from .saved import every_of, mode_of, native

    mode = mode_of(mode)  # refused before anything is built
    every_of(every)
    native.chosen(path)
    with descriptors_said():
        from .runtime.checklib import prepare

        prepare(path)
    return _check(mode, path, every, findings)
