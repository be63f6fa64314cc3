"""The one error type for bad input, rendered like a compiler message.

Anything the user can get wrong (a path, a yaml, an overlay, a flag) is an
``InputError``; the CLI prints ``FILE:LINE: error: MESSAGE`` and exits 2.
Every other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class InputError(Exception):
    path: str | None
    line: int | None
    message: str
    hint: str | None = None

    def __post_init__(self) -> None:
        super().__init__(self.render())

    def render(self) -> str:
        where = display_path(self.path) if self.path else "torchgen-patch"
        if self.line:
            where = f"{where}:{self.line}"
        text = f"{where}: error: {self.message}"
        if self.hint:
            text += f" (hint: {self.hint})"
        return text

    def __str__(self) -> str:
        return self.render()


def display_path(path: str) -> str:
    """A path as the user would like to read it: relative when under the cwd."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def one_line(text: str) -> str:
    """Collapse a multi-line message (torchgen's, say) to its first line."""
    for part in str(text).splitlines():
        if part.strip():
            return part.strip()
    return str(text).strip() or "unknown error"
