"""Codegen: the plan rendered into C++ sources through Jinja templates, and written."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .render import (MANIFEST, compiled_sources, output_names, render, render_boxed, render_saved, saved_kernel_source,
                     template_names)

if TYPE_CHECKING:
    from .output import cmake_fragment, write_all

__all__ = ["MANIFEST", "cmake_fragment", "compiled_sources", "output_names", "render", "render_boxed", "render_saved",
           "saved_kernel_source", "template_names", "write_all"]

# gen's writing (output.py) is imported when it is first named: a cached install() reads the templates'
# folder through render.py and never writes an output
_WRITING = {"cmake_fragment": ".output", "write_all": ".output"}


def __getattr__(name: str):
    if name in _WRITING:
        return getattr(importlib.import_module(_WRITING[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
