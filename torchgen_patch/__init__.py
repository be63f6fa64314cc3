"""torchgen-patch: ADInplaceOrView (version-counter) kernels for the PyTorch
ops that mutate arguments and return nothing."""

__version__ = "0.1.0"

__all__ = ["__version__", "install", "installed_ops", "uninstall"]


def install(*args, **kwargs):
    from .installer import install as _install

    return _install(*args, **kwargs)


def installed_ops():
    from .installer import installed_ops as _installed

    return _installed()


def uninstall():
    from .installer import uninstall as _uninstall

    return _uninstall()
