"""Output: the generated directory (atomic, write-only-if-changed files, as
torchgen's FileManager writes them) and the CMake output-dependency fragment."""

from __future__ import annotations

import os

from ..errors import InputError
from ..files import write_if_changed


def write_all(out_dir: str, files: dict[str, bytes]) -> list[str]:
    """Write every file of ``files`` (relative names) under ``out_dir``.

    Checks that the directory is writable before touching anything, so a bad
    output directory leaves it exactly as it was. Returns the names written.
    """
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise InputError(out_dir, None, "output path exists and is not a directory")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise InputError(out_dir, None, f"cannot create output directory: {e.strerror}") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise InputError(out_dir, None, "output directory is not writable")
    stale = sorted(set(previous_outputs(out_dir)) - set(files))
    written = []
    for name in sorted(files):
        try:
            if write_if_changed(os.path.join(out_dir, name), files[name]):
                written.append(name)
        except OSError as e:
            raise InputError(os.path.join(out_dir, name), None, f"cannot write: {e.strerror}") from None
    for name in stale:  # after the new manifest is in place: a crash in between leaves only extra files
        try:
            os.unlink(os.path.join(out_dir, name))
        except FileNotFoundError:
            pass
        except OSError as e:
            raise InputError(os.path.join(out_dir, name), None, f"cannot remove a stale output: {e.strerror}") from None
    return written


def previous_outputs(out_dir: str) -> list[str]:
    """The files an earlier ``gen`` wrote into ``out_dir``, known from its manifest (never a
    file it did not name); [] when there is no readable manifest."""
    import json

    from .render import MANIFEST, MAX_SHARDS, output_names

    try:
        with open(os.path.join(out_dir, MANIFEST), encoding="utf-8") as fh:
            shards = json.load(fh)["shards"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        return []
    return [n for n in output_names(shards) if os.path.isfile(os.path.join(out_dir, n))]


def cmake_fragment(var: str, out_dir: str, names: list[str]) -> str:
    lines = [f"set({var}"]
    for n in sorted(names):
        lines.append(f'    "{out_dir.rstrip("/")}/{n}"')
    lines.append(")")
    return "\n".join(lines) + "\n"
