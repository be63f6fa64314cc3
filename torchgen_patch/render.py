"""Render: Jinja templates → C++ text. Templates only arrange text."""

from __future__ import annotations

import os


def templates_dir() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(os.path.dirname(here), "templates")
    if os.path.isdir(src):
        return src
    from importlib.resources import files

    return str(files("torchgen_patch.templates"))


def template_names() -> set[str]:
    return {n for n in os.listdir(templates_dir()) if n.endswith(".j2")}
