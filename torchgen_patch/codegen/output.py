"""Output: the generated directory (atomic, write-only-if-changed files, as
torchgen's FileManager writes them) and the CMake output-dependency fragment."""

from __future__ import annotations

import errno
import os
import re
import stat

from .. import files as _files
from ..errors import EnvironmentProblem, InputError
from ..fs import atomic
from ..fs.atomic import RENAME_EXCHANGE, renameat2
from ..fs.decode import loads
from ..fs.locks import output_lock
from ..fs.protected import display, keep_owner_and_mode, umask
from ..fs.walk import find, refuse_foreign_dir
from .render import MANIFEST


STAGING = ".staging-"  # .DIR.staging-XXXX: a directory gen fills beside its output directory DIR
_GEN_NAME = re.compile(r"ADInplaceOrViewPatch_\d+\.cpp|ADInplaceOrViewPatchEverything\.cpp|"
                       r"RegisterADInplaceOrViewPatch\.cpp|TorchgenPatchRuntime\.h|torchgen_patch_manifest\.json")
_TEMP = re.compile(r"\.tmp-[0-9a-f]{12}")  # fs.atomic.replace_at's temporary files


def write_all(out_dir: str, files: dict[str, bytes], log=None) -> list[str]:
    """Write ``files`` (relative names) as the directory ``out_dir``, in one transaction.

    The new directory is filled beside the old one and exchanged with it in one step
    (``renameat2(RENAME_EXCHANGE)``: a reader sees the old directory or the new one, never a mix; a
    failure leaves the old one as it was). Files whose content is unchanged are carried over by
    hard link, so they keep their mtime and a build system rebuilds nothing for them; nothing
    changed: nothing is touched at all. Files gen did not write are carried over too, and so are
    those written into the old directory while gen swaps it; the files of gen's own earlier runs
    that ``files`` no longer names are dropped. Where the file system cannot exchange (NFS, some
    FUSE), the changed files are renamed into the directory one by one, the manifest last: the
    directory is never absent, only gen's own files change. The new directory keeps the old one's
    owner and mode; a changed file keeps the mode of the file it replaces where that one is this
    account's own (``_keep_file``).

    Everything is done through descriptors of the directories found once (``fs.walk.find``: a
    symlinked ``out_dir`` is followed only where the kernel's protected-symlinks rule would, and
    stays a link; neither ``out_dir`` nor the directory that holds it may be one another account
    controls). A lock no other account can make or hold serializes concurrent runs (``output_lock``);
    ``log(line)`` (default: stderr) hears when one waits for another. Returns the names whose
    content changed."""
    with find(out_dir, "output directory") as f:
        if f.blocked:
            raise InputError(out_dir, None, f"cannot create output directory: {display(f.blocked)} "
                             "is not a directory")
        if f.st is not None and not stat.S_ISDIR(f.st.st_mode):
            raise InputError(out_dir, None, "output path exists and is not a directory")
        try:
            f.make_dirs()
        except OSError as e:
            raise InputError(out_dir, None, f"cannot create output directory: {e.strerror}") from None
        if not os.access(f.where, os.W_OK | os.X_OK) or (f.st is not None and not os.access(f.path, os.W_OK)):
            raise InputError(out_dir, None, "output directory is not writable")
        if f.st is not None:
            up = os.fstat(f.dir_fd)
            mount = f.st.st_dev != up.st_dev or f.st.st_ino == up.st_ino
            if mount or os.path.samestat(f.st, os.stat(os.curdir)):
                raise InputError(out_dir, None, "gen replaces its output directory whole, and this one is "
                                 + ("a mount point" if mount else "the current directory"),
                                 "give a directory inside it")
        with output_lock(f.dir_fd, f.name, f.path, log):
            return _write(f.dir_fd, f.name, out_dir, files)


def _write(parent: int, base: str, shown: str, files: dict[str, bytes]) -> list[str]:
    """write_all under the lock: ``base`` in the open directory ``parent``."""
    for n in _leftovers(parent, base):
        _salvage(parent, n, base)
    old = _open_dir(parent, base)
    if old is None and _lexists(parent, base):
        raise InputError(shown, None, "output path exists and is not a directory")
    try:
        if old is not None:
            refuse_foreign_dir(os.fstat(old), shown, shown, "output directory")
        have = read_named(old, sorted(files)) if old is not None else {}
        changed = [n for n in sorted(files) if have.get(n) != files[n]]
        stale = set(previous_outputs(old)) - set(files) if old is not None else set()
        if old is not None and not changed and not stale:
            return []
        foreign = sorted(set(os.listdir(old)) - set(files) - stale) if old is not None else []
        for n in foreign:
            st = os.stat(n, dir_fd=old, follow_symlinks=False)
            if not (stat.S_ISLNK(st.st_mode) or stat.S_ISREG(st.st_mode)):
                raise InputError(os.path.join(shown, n), None, "gen carries over only files into its new output "
                                 "directory, and this is not a file", "give gen a directory of its own")
        staging, sfd = _mkdtemp(parent, f".{base}{STAGING}")
        name = None
        try:
            old_st = os.fstat(old) if old is not None else None
            if old_st is not None:
                keep_owner_and_mode(sfd, old_st)
            for name in sorted(files):
                if name in changed:
                    atomic.atomic_write((sfd, name), files[name])
                    if old is not None:
                        _keep_file(sfd, name, old)
                else:
                    _carry(old, sfd, name)  # type: ignore[arg-type]  # unchanged: old is there
            for name in foreign:
                _carry(old, sfd, name)  # type: ignore[arg-type]  # foreign: old is there
            name = None
            if old is None:
                os.fchmod(sfd, 0o777 & ~umask())
            _fsync(sfd)
            if old is None:
                os.rename(staging, base, src_dir_fd=parent, dst_dir_fd=parent)
            elif not _exchange(parent, staging, base):
                _in_place(sfd, old, changed, stale)
            _salvage(parent, staging, base)  # now the old directory: what others wrote into it moves over
            _fsync(parent)
        except OSError as e:
            _salvage(parent, staging, base)
            where = os.path.join(shown, name) if name else shown
            raise _files.write_failed(where, "cannot write", e) from None
        except BaseException:
            _salvage(parent, staging, base)
            raise
        finally:
            os.close(sfd)
    finally:
        if old is not None:
            os.close(old)
    return changed


def _in_place(staging: int, out: int, changed: list[str], stale: set[str]) -> None:
    """Where directories cannot be exchanged: each changed file renamed into the output directory
    (each file whole), gen's stale files removed, the manifest last: once it is in place, the
    directory is one run's output. Nothing else in the directory is touched, so it is never absent
    and no other file in it is lost; a reader that takes gen's lock (``lint --generated``) never
    sees a mix."""
    for n in [n for n in changed if n != MANIFEST]:
        os.replace(n, n, src_dir_fd=staging, dst_dir_fd=out)
    for n in sorted(stale):
        try:
            os.unlink(n, dir_fd=out)
        except FileNotFoundError:
            pass
    if MANIFEST in changed:
        os.replace(MANIFEST, MANIFEST, src_dir_fd=staging, dst_dir_fd=out)


def _keep_file(staging: int, name: str, old: int) -> None:
    """The new file ``name`` takes the mode (and group) of the one it replaces in ``old`` where that
    one is this account's own; anything else (no file, another account's) lends it nothing: it keeps
    the umask's mode and this account's owner (root's output never keeps another account's)."""
    try:
        was = os.stat(name, dir_fd=old, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(was.st_mode) or was.st_uid != os.geteuid():
        return
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=staging)
    try:
        keep_owner_and_mode(fd, was)
    finally:
        os.close(fd)


def _leftovers(parent: int, base: str) -> list[str]:
    """Staging directories of a run that died (the lock is held: no live run owns one)."""
    fd = os.open(os.curdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent)
    try:
        return sorted(n for n in os.listdir(fd) if n.startswith(f".{base}{STAGING}"))
    finally:
        os.close(fd)


def _salvage(parent: int, name: str, base: str) -> None:
    """Empty and remove the directory ``name`` gen left beside ``base`` (a staging directory, or the
    old output directory after the exchange), losing no file of anyone's: an entry goes when
    ``base`` holds the same file (a hard link, or the same bytes or symlink), when it is one of
    ``fs.atomic.replace_at``'s temporary files, or when it is one of gen's own outputs that ``base``
    now has a version of or that gen wrote; anything else moves into ``base`` where the name is
    free, and stays (with the directory) where it is not. A directory another account owns is left
    alone (only root's own runs give one another owner: the output directory's)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError:
        return
    out = _open_dir(parent, base)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() and not (os.geteuid() == 0 and out is not None
                                              and st.st_uid == os.fstat(out).st_uid):
            return
        for n in sorted(os.listdir(fd)):
            if _disposable(fd, n, out):
                os.unlink(n, dir_fd=fd)
            elif out is not None and not _lexists(out, n):
                _move(fd, out, n)
        os.rmdir(name, dir_fd=parent)
    except OSError:
        pass  # something stayed (or could not be moved): the next gen tries again
    finally:
        os.close(fd)
        if out is not None:
            os.close(out)


def _disposable(d: int, n: str, out: int | None) -> bool:
    st = os.stat(n, dir_fd=d, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        return False
    there = None
    if out is not None:
        try:
            there = os.stat(n, dir_fd=out, follow_symlinks=False)
        except FileNotFoundError:
            pass
    if there is not None and out is not None and (os.path.samestat(st, there) or _same(d, out, n, st, there)):
        return True
    if stat.S_ISREG(st.st_mode) and _TEMP.fullmatch(n):
        return True
    return bool(_GEN_NAME.fullmatch(n)) and stat.S_ISREG(st.st_mode) and (there is not None or _ours(d, n))


def _same(a: int, b: int, n: str, sa: os.stat_result, sb: os.stat_result) -> bool:
    if stat.S_ISLNK(sa.st_mode) and stat.S_ISLNK(sb.st_mode):
        return os.readlink(n, dir_fd=a) == os.readlink(n, dir_fd=b)
    if stat.S_ISREG(sa.st_mode) and stat.S_ISREG(sb.st_mode) and sa.st_size == sb.st_size:
        return read_named(a, [n]).get(n) == read_named(b, [n]).get(n)
    return False


def _move(src: int, dst: int, n: str) -> None:
    """``n`` from ``src`` into ``dst``, never over a file of the same name there (a hard link then an
    unlink for a file; a directory or symlink by rename where the name is still free)."""
    st = os.stat(n, dir_fd=src, follow_symlinks=False)
    if stat.S_ISREG(st.st_mode):
        try:
            os.link(n, n, src_dir_fd=src, dst_dir_fd=dst, follow_symlinks=False)
        except FileExistsError:
            return
        except OSError:
            if _lexists(dst, n):
                return
            os.rename(n, n, src_dir_fd=src, dst_dir_fd=dst)
            return
        os.unlink(n, dir_fd=src)
    elif not _lexists(dst, n):
        os.rename(n, n, src_dir_fd=src, dst_dir_fd=dst)


def _open_dir(parent: int, name: str) -> int | None:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:  # a symlink where the directory was
            return None
        raise


def _lexists(d: int, n: str) -> bool:
    try:
        os.stat(n, dir_fd=d, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _mkdtemp(parent: int, prefix: str) -> tuple[str, int]:
    """A new private directory in ``parent``: its name and an open descriptor."""
    import secrets

    while True:
        name = prefix + secrets.token_hex(4)
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            continue
        return name, os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)


def read_named(d: int, names) -> dict[str, bytes]:
    """The regular files among ``names`` in the open directory ``d`` (those present)."""
    out = {}
    for n in names:
        try:
            fd = os.open(n, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0), dir_fd=d)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as fh:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                out[n] = fh.read()
    return out


def read_outputs(directory: str, names=None) -> dict[str, bytes]:
    """The named files of ``directory`` (those present; None: every name gen writes), all read
    through one open directory and read again if a gen swapped in a new directory meanwhile: never
    a mix of two runs' files."""
    with find(directory, "generated directory", write=False) as f:
        return _read_through(f.dir_fd, f.name, f.path, names)


def _read_through(parent: int, name: str, shown: str, names) -> dict[str, bytes]:
    for _ in range(100):
        try:
            dfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except FileNotFoundError:
            continue  # between the two renames of a swap elsewhere: look again
        except OSError as e:
            raise InputError(shown, None, f"cannot read the directory: {e.strerror}") from None
        try:
            wanted = sorted(n for n in os.listdir(dfd) if _GEN_NAME.fullmatch(n)) if names is None else names
            out = read_named(dfd, wanted)
            same = os.path.samestat(os.fstat(dfd), os.stat(name, dir_fd=parent))
        except FileNotFoundError:
            same = False  # swapped out between the two looks
        finally:
            os.close(dfd)
        if same:
            return out
    raise InputError(shown, None, "the directory kept changing while it was read")


def snapshot(directory: str, log=None) -> dict[str, bytes]:
    """Every file gen writes that ``directory`` holds, as one run wrote them: read under gen's lock
    (where this account can take it: its own, beside the directory), so a gen that renames files
    in one by one (no directory exchange) is never seen half-way."""
    with find(directory, "generated directory", write=False) as f:
        with output_lock(f.dir_fd, f.name, f.path, log, required=False):
            return _read_through(f.dir_fd, f.name, f.path, None)


def _carry(src: int, dst: int, name: str) -> None:
    """``name`` from the old directory into the new one as it is: a hard link (same inode, same
    mtime), a copy where links cannot be made, a symlink as a symlink."""
    st = os.stat(name, dir_fd=src, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=src), name, dir_fd=dst)
        return
    try:
        os.link(name, name, src_dir_fd=src, dst_dir_fd=dst, follow_symlinks=False)
    except OSError:
        data = read_named(src, [name])[name]
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dst)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            keep_owner_and_mode(fd, st)
            os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))


def _exchange(parent: int, a: str, b: str) -> bool:
    """Exchange the entries ``a`` and ``b`` of ``parent`` in one step (Linux renameat2
    RENAME_EXCHANGE); False where this system or file system cannot."""
    return renameat2(parent, a, b, RENAME_EXCHANGE)


def _fsync(fd: int) -> None:
    try:
        os.fsync(fd)
    except OSError:
        pass


def previous_outputs(out: int) -> list[str]:
    """The files an earlier ``gen`` wrote into the open directory ``out``, known from its manifest
    (never a file it did not name); [] when there is no readable manifest."""
    from .render import MAX_SHARDS, output_names

    try:
        shards = loads(read_named(out, [MANIFEST])[MANIFEST])["shards"]
    except (KeyError, ValueError, TypeError):
        return []
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        return []
    present = set(os.listdir(out))
    names = [n for n in output_names(shards) if n in present and _regular(out, n)]
    # and shards left by an even earlier run that this manifest no longer names: only files that
    # carry gen's own first line
    for n in sorted(present):
        if re.fullmatch(r"ADInplaceOrViewPatch_\d+\.cpp", n) and n not in names and _ours(out, n):
            names.append(n)
    return names


def _regular(d: int, n: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(n, dir_fd=d, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def _ours(d: int, n: str) -> bool:
    """Whether the file ``n`` of ``d`` is one gen wrote: its first line, or the manifest's generator."""
    try:
        fd = os.open(n, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0), dir_fd=d)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        if n != MANIFEST:
            return fh.readline().startswith(b"// @generated by torchgen-patch")
        try:
            return loads(fh.read()).get("generator") == "torchgen-patch"
        except (ValueError, AttributeError):
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
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for d in (os.path.join(pkg, "cmake"), os.path.join(os.path.dirname(pkg), "cmake")):
        if os.path.isfile(os.path.join(d, "TorchgenPatch.cmake")):
            return d
    raise EnvironmentProblem(f"TorchgenPatch.cmake is not installed with torchgen-patch ({pkg})",
                             "reinstall torchgen-patch from its wheel or source tree")
