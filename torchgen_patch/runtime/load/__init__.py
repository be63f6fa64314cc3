"""Load: a library this tool built (or a prebuilt wheel's) checked by the trust rules (``trust.py``),
loaded from the very descriptor that was checked (``loader.py``), and its kernels registered in this
torch's dispatcher, or the Python ones in their place (``registration.py``); what this process
registered is one ``Registry`` (``state.py``).

``register(artifact)`` is the one entry point for a built library: trust → dlopen → the library's
statement of its build → registration."""

from __future__ import annotations

from .loader import load, load_built
from .registration import (Candidate, InstallReport, check, evidence, installed_ops, register, register_python,
                           register_runtime, select, uninstall)
from .state import REGISTRY, Registry

__all__ = ["Candidate", "InstallReport", "REGISTRY", "Registry", "check", "evidence", "installed_ops", "load",
           "load_built", "register", "register_python", "register_runtime", "select", "uninstall"]
