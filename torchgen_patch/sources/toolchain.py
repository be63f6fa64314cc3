"""Where a toolchain is: the installed torch's torchgen (found without importing it, or torch) or a
PyTorch checkout's own torchgen and tools/autograd, and the content identity of either. Nothing
here imports torchgen; ``torchgen.py`` is what talks to it."""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import sys
from dataclasses import dataclass

from ..errors import EnvironmentProblem, InputError

INSTALLED, CHECKOUT = "installed", "checkout"


@dataclass(frozen=True)
class Toolchain:
    world: str  # installed | checkout
    path_entry: str  # the sys.path entry that holds the torchgen package (and, in a checkout, tools/)
    autograd: str  # the autograd codegen's package: torchgen.packaged.autograd | tools.autograd

    @property
    def torchgen_dir(self) -> str:
        return os.path.join(self.path_entry, "torchgen")

    @property
    def autograd_dir(self) -> str:
        return os.path.join(self.path_entry, *self.autograd.split("."))

    def identity(self) -> str:
        """Content identity of the torchgen package and the autograd codegen (sha256)."""
        return _identity(self.torchgen_dir, self.autograd_dir)


def installed() -> Toolchain:
    """The installed torch's torchgen, found without importing it (or torch). The current
    directory is not searched: run inside a PyTorch checkout, `python -m torchgen_patch`
    would otherwise take the checkout's torchgen for the installed one (--pytorch-root is
    how a checkout is asked for)."""
    cwd = os.getcwd()
    spec = importlib.machinery.PathFinder.find_spec(
        "torchgen", [p for p in sys.path if p not in ("", ".") and os.path.abspath(p) != cwd])
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise EnvironmentProblem("no installed torchgen: this Python has no torch",
                                 "install torch, or give --pytorch-root DIR to use a PyTorch checkout's own "
                                 "torchgen")
    tc = Toolchain(INSTALLED, os.path.dirname(os.path.abspath(locations[0])), "torchgen.packaged.autograd")
    if not os.path.isfile(os.path.join(tc.autograd_dir, "gen_inplace_or_view_type.py")):
        raise InputError(tc.autograd_dir, None, "the installed torchgen ships no autograd codegen "
                         "(torchgen/packaged/autograd)", "use --pytorch-root with a PyTorch checkout")
    return tc


def checkout(root: str) -> Toolchain:
    """A PyTorch checkout's own torchgen and tools/autograd (checked, not imported yet)."""
    root = os.path.abspath(root)
    for rel, what in (("torchgen/__init__.py", "torchgen/"), ("tools/autograd/gen_inplace_or_view_type.py",
                                                             "tools/autograd/")):
        if not os.path.isfile(os.path.join(root, rel)):
            raise InputError(root, None, f"not a PyTorch checkout: {rel} is missing",
                             f"--pytorch-root needs the checkout's own {what}; is the checkout complete?")
    return Toolchain(CHECKOUT, root, "tools.autograd")


def _identity(*dirs: str) -> str:
    """Read every time (about 6 ms): a checkout edited between two calls is another toolchain."""
    h = hashlib.sha256()
    for d in dirs:
        d = os.path.normpath(d)
        for base, subdirs, names in os.walk(d):
            subdirs[:] = sorted(s for s in subdirs if s not in ("__pycache__", "packaged"))
            rel = base[len(d) + 1:] + os.sep if base != d else ""  # os.path.relpath's answer, without its cost
            for name in sorted(names):
                p = os.path.join(base, name)
                if name.endswith((".py", ".yaml")) and os.path.isfile(p):  # a regular file, a link followed
                    try:
                        with open(p, "rb") as fh:
                            h.update((rel + name).encode() + b"\0" + fh.read() + b"\0")
                    except OSError as e:
                        raise InputError(p, None, f"cannot read: {e.strerror}") from None
    return h.hexdigest()
