"""Codegen: the plan rendered into C++ sources through Jinja templates, and written."""

from .output import cmake_fragment, write_all
from .render import (MANIFEST, compiled_sources, output_names, render, render_boxed, render_saved, saved_kernel_source,
                     template_names)

__all__ = ["MANIFEST", "cmake_fragment", "compiled_sources", "output_names", "render", "render_boxed", "render_saved",
           "saved_kernel_source", "template_names", "write_all"]
