"""Output: the generated directory (atomic, write-only-if-changed files, as
torchgen's FileManager writes them) and the CMake output-dependency fragment."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile

from .. import files as _files
from ..errors import InputError


STAGING = ".staging-"  # a directory gen is filling, beside its output directory


def write_all(out_dir: str, files: dict[str, bytes]) -> list[str]:
    """Write ``files`` (relative names) as the directory ``out_dir``, in one transaction.

    The new directory is filled beside the old one and swapped in whole (a reader sees the old
    directory or the new one, never a mix; a failure leaves the old one as it was). Files whose
    content is unchanged are carried over by hard link, so they keep their mtime and a build
    system rebuilds nothing for them; nothing changed: nothing is touched at all. Files gen did
    not write are carried over too; the files of gen's own earlier runs that ``files`` no longer
    names are dropped. A lock on the parent directory serializes concurrent runs (the second
    waits). A symlinked ``out_dir`` stays a link: its target is replaced. Returns the names
    whose content changed."""
    link = out_dir
    out_dir = os.path.realpath(out_dir) if os.path.islink(out_dir) else os.path.abspath(out_dir)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise InputError(link, None, "output path exists and is not a directory")
    parent = os.path.dirname(out_dir)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise InputError(link, None, f"cannot create output directory: {e.strerror}") from None
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.isdir(out_dir) and not os.access(out_dir, os.W_OK)):
        raise InputError(link, None, "output directory is not writable")
    if os.path.isdir(out_dir) and (os.path.ismount(out_dir) or os.path.samefile(out_dir, os.getcwd())):
        raise InputError(link, None, "gen replaces its output directory whole, and this one is "
                         + ("a mount point" if os.path.ismount(out_dir) else "the current directory"),
                         "give a directory inside it")
    with _locked(parent):
        _drop_leftovers(parent, os.path.basename(out_dir))
        old = out_dir if os.path.isdir(out_dir) else None
        have = read_outputs(old, sorted(files)) if old else {}
        changed = [n for n in sorted(files) if have.get(n) != files[n]]
        stale = set(previous_outputs(old)) - set(files) if old else set()
        if old and not changed and not stale:
            return []
        foreign = sorted(set(os.listdir(old)) - set(files) - stale) if old else []
        for n in foreign:
            if not (os.path.islink(os.path.join(old, n)) or os.path.isfile(os.path.join(old, n))):
                raise InputError(os.path.join(link, n), None, "gen carries over only files into its new output "
                                 "directory, and this is not a file", "give gen a directory of its own")
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}{STAGING}", dir=parent)
        name = None
        try:
            for name in sorted(files):
                if name in changed:
                    _files.atomic_write(os.path.join(staging, name), files[name])
                else:
                    _carry(os.path.join(old, name), os.path.join(staging, name))
            for name in foreign:
                _carry(os.path.join(old, name), os.path.join(staging, name))
            name = None
            os.chmod(staging, os.stat(old).st_mode & 0o7777 if old else 0o777 & ~_umask())
            _fsync_dir(staging)
            if old is None:
                os.rename(staging, out_dir)
            else:
                _swap(staging, out_dir)
                shutil.rmtree(staging, ignore_errors=True)  # now the old directory
            _fsync_dir(parent)
        except OSError as e:
            shutil.rmtree(staging, ignore_errors=True)
            where = os.path.join(link, name) if name else link
            raise InputError(where, None, f"cannot write: {e.strerror}") from None
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return changed


def read_outputs(directory: str, names) -> dict[str, bytes]:
    """The named files of ``directory`` (those present), all read through one open directory and
    read again if a gen swapped in a new directory meanwhile: never a mix of two runs' files."""
    for _ in range(100):
        out = {}
        dfd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            for n in names:
                try:
                    fd = os.open(n, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0), dir_fd=dfd)
                except OSError:
                    continue
                with os.fdopen(fd, "rb") as fh:
                    if stat.S_ISREG(os.fstat(fd).st_mode):
                        out[n] = fh.read()
            same = os.path.samestat(os.fstat(dfd), os.stat(directory))
        except FileNotFoundError:
            same = False  # swapped out between the two looks
        finally:
            os.close(dfd)
        if same:
            return out
    raise InputError(directory, None, "the directory kept changing while it was read")


@contextlib.contextmanager
def _locked(directory: str):
    try:
        import fcntl
    except ImportError:  # no flock (Windows): no serialization, the swap is still whole
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _drop_leftovers(parent: str, base: str) -> None:
    """Staging directories of a run that died (the lock is held: no live run owns one)."""
    for n in os.listdir(parent):
        if n.startswith(f".{base}{STAGING}"):
            shutil.rmtree(os.path.join(parent, n), ignore_errors=True)


def _carry(src: str, dst: str) -> None:
    """``src`` into the new directory as it is: a hard link (same inode, same mtime), a copy
    where links cannot be made, a symlink as a symlink."""
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _swap(new: str, target: str) -> None:
    """Exchange two directories in one step (Linux renameat2 RENAME_EXCHANGE); where that is
    unavailable, two renames (a reader may then find no directory for an instant)."""
    if _exchange(new, target):
        return
    aside = new + ".old"
    os.rename(target, aside)
    try:
        os.rename(new, target)
    except OSError:
        os.rename(aside, target)
        raise
    os.rename(aside, new)


def _exchange(a: str, b: str) -> bool:
    import ctypes
    import errno

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False  # this file system cannot exchange
    raise OSError(err, os.strerror(err), b)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


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
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        return []
    names = [n for n in output_names(shards) if os.path.isfile(os.path.join(out_dir, n))]
    # and shards left by an even earlier run that this manifest no longer names: only files that
    # carry gen's own first line
    for n in sorted(os.listdir(out_dir)):
        if re.fullmatch(r"ADInplaceOrViewPatch_\d+\.cpp", n) and n not in names and _ours(os.path.join(out_dir, n)):
            names.append(n)
    return names


def _ours(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.readline().startswith(b"// @generated by torchgen-patch")
    except OSError:
        return False


def cmake_fragment(var: str, out_dir: str, names: list[str]) -> str:
    """``set(var "path" ...)``; each path a CMake quoted argument (``\\``, ``"`` and ``$`` escaped). A
    directory name with ';' (a list separator) or a control character cannot be one: refused."""
    bad = [c for c in out_dir if c == ";" or not c.isprintable()]
    if bad:
        raise InputError(out_dir, None, f"the output directory's name has {ascii(bad[0])}, which a CMake list "
                                        "of paths cannot hold", "choose another --out directory")
    quoted = out_dir.rstrip("/").replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    lines = [f"set({var}"]
    for n in sorted(names):
        lines.append(f'    "{quoted}/{n}"')
    lines.append(")")
    return "\n".join(lines) + "\n"


def cmake_dir() -> str:
    """The folder holding TorchgenPatch.cmake (``torchgen-patch --cmake-dir``): inside the installed
    package (torchgen_patch/cmake/), or a source checkout's cmake/ beside the package. Either way
    the templates it makes the build depend on are in ``../templates`` from there."""
    from ..errors import EnvironmentProblem

    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for d in (os.path.join(pkg, "cmake"), os.path.join(os.path.dirname(pkg), "cmake")):
        if os.path.isfile(os.path.join(d, "TorchgenPatch.cmake")):
            return d
    raise EnvironmentProblem(f"TorchgenPatch.cmake is not installed with torchgen-patch ({pkg})",
                             "reinstall torchgen-patch from its wheel or source tree")
