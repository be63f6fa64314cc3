"""Write: atomic, write-only-if-changed file output (torchgen's FileManager
conventions), and the CMake output-dependency fragment."""

from __future__ import annotations

import os
import tempfile

from .errors import InputError


def atomic_write(path: str, data: bytes, durable: bool = True) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory
    and a rename: a reader sees the old file or the new one, never a part.
    ``durable=False`` skips the fsync (caches: losing one costs only time)."""
    d = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=d)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_if_changed(path: str, data: bytes) -> bool:
    """Write only when the content differs; return whether it was written."""
    try:
        with open(path, "rb") as fh:
            if fh.read() == data:
                return False
    except OSError:
        pass
    atomic_write(path, data)
    return True


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
    written = []
    for name in sorted(files):
        try:
            if write_if_changed(os.path.join(out_dir, name), files[name]):
                written.append(name)
        except OSError as e:
            raise InputError(os.path.join(out_dir, name), None, f"cannot write: {e.strerror}") from None
    return written


def cmake_fragment(var: str, out_dir: str, names: list[str]) -> str:
    lines = [f"set({var}"]
    for n in sorted(names):
        lines.append(f'    "{out_dir.rstrip("/")}/{n}"')
    lines.append(")")
    return "\n".join(lines) + "\n"
