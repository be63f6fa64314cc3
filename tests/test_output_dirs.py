"""Outputs only into directories no other account controls: an output into a directory another account
(not root) owns, or one its group or others can write without the sticky bit, is refused in one line
(exit 2) when the writer does not own that directory, root included; a symlink or a file another
account planted there gets nothing. Sticky shared directories of root's (/tmp) keep the kernel's rules.
A file an output replaces lends it its mode only when it is the writer's own: root's output never
keeps another account's owner or mode. Runs as root with a real second account (``tgpeer``)."""

from __future__ import annotations

import os
import stat

import pytest

from tests.test_cache_input import _second_account
from tests.test_output_trust import sticky
from tests.test_outputs import DIR_OUTPUTS, FILE_OUTPUTS, FUNCS, ctx, tree

PEER = "tgpeer"
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="other accounts' directories are made as root")


@pytest.fixture(scope="module")
def peer() -> int:
    """The second account's uid (made with useradd once, reused after)."""
    return _second_account(PEER)


@pytest.fixture
def theirs(sticky, peer):
    """The tracker's setup: a 0777 directory the second account made inside the sticky one."""
    d = sticky / "drop"
    d.mkdir()
    os.chmod(d, 0o777)
    os.chown(d, peer, peer)
    return d


def _as_peer(path, peer, mode=None):
    os.lchown(path, peer, peer)
    if mode is not None:
        os.chmod(path, mode)


def _refused(rc, err, where, owner="tgpeer"):
    """One `error:` line, exit 2, naming the directory, its owner and mode, with a hint."""
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "error:" in err and str(where) in err and f"{owner} (uid " in err and "(mode " in err, err
    assert "(hint: " in err and "directory of your own" in err, err


@pytest.mark.parametrize("key", sorted(FILE_OUTPUTS))
def test_an_output_into_a_directory_another_account_owns_is_refused(key, ctx, theirs, run_cli):
    argv, _ = FILE_OUTPUTS[key](ctx, theirs / "out")
    rc, _, err = run_cli(*argv)
    _refused(rc, err, theirs)
    assert os.listdir(theirs) == []


@pytest.mark.parametrize("key", sorted(FILE_OUTPUTS))
def test_a_link_planted_in_such_a_directory_is_not_followed(key, ctx, theirs, peer, run_cli):
    """The tracker's first case: their link to a file of root's own, in their 0777 directory."""
    precious = ctx["tmp"] / "precious"
    precious.write_text("root's own\n")
    os.chmod(precious, 0o600)
    os.symlink(precious, theirs / "report")
    _as_peer(theirs / "report", peer)
    argv, _ = FILE_OUTPUTS[key](ctx, theirs / "report")
    rc, _, err = run_cli(*argv)
    _refused(rc, err, theirs)
    assert precious.read_text() == "root's own\n" and os.path.islink(theirs / "report")


@pytest.mark.parametrize("key", sorted(FILE_OUTPUTS))
def test_a_0666_file_of_theirs_in_such_a_directory_is_not_replaced(key, ctx, theirs, peer, run_cli):
    """The tracker's second case: root's output over their 0666 file would stay theirs, 0666."""
    planted = theirs / "report"
    planted.write_text("theirs\n")
    _as_peer(planted, peer, 0o666)
    argv, _ = FILE_OUTPUTS[key](ctx, planted)
    rc, _, err = run_cli(*argv)
    _refused(rc, err, theirs)
    assert planted.read_text() == "theirs\n" and os.stat(planted).st_uid == os.stat(theirs).st_uid


@pytest.mark.parametrize("key", sorted(DIR_OUTPUTS))
def test_a_directory_output_into_or_inside_theirs_is_refused(key, ctx, theirs, run_cli):
    """`wheel -o DIR` (the user names only the directory: the wheel's name is predictable) and
    `gen -o DIR`, with DIR theirs or missing inside theirs: refused before any work."""
    for out in (theirs, theirs / "sub"):
        rc, _, err = run_cli(*DIR_OUTPUTS[key](ctx, out))
        _refused(rc, err, theirs)
    assert os.listdir(theirs) == []


def test_a_directory_of_roots_inside_theirs_is_refused_too(ctx, theirs, run_cli, monkeypatch):
    """Their directory on the way is theirs to rename: root's own directory below it (or a working
    directory there, for a relative path) could be swapped for theirs before the output is used."""
    mine = theirs / "roots"
    mine.mkdir(mode=0o755)
    for argv in (["lint", ctx["native"], "-o", mine / "r.txt"], ["wheel", "-o", mine]):
        rc, _, err = run_cli(*argv)
        _refused(rc, err, theirs)
    monkeypatch.chdir(mine)
    rc, _, err = run_cli("lint", ctx["native"], "-o", "r.txt")
    _refused(rc, err, theirs)
    assert os.listdir(mine) == []


@pytest.mark.parametrize("planted", ["link", "file", "none"])
def test_the_wheel_is_not_published_into_their_directory(theirs, peer, tmp_path, planted):
    """The write itself (not only the check before the build) refuses their directory, whatever is
    at the wheel's predictable name."""
    from torchgen_patch.errors import InputError
    from torchgen_patch.runtime import prebuilt

    made, precious = tmp_path / "made.whl", tmp_path / "precious"
    made.write_bytes(b"PK")
    precious.write_bytes(b"root's own")
    target = theirs / "torchgen_patch_kernels-1-cp3-none-linux_x86_64.whl"
    if planted == "link":
        os.symlink(precious, target)
    elif planted == "file":
        target.write_bytes(b"theirs")
    if planted != "none":
        _as_peer(target, peer, None if planted == "link" else 0o666)
    with pytest.raises(InputError) as e:
        prebuilt._publish(str(made), str(target), str(theirs))
    assert f"{theirs}: tgpeer (uid {peer}) owns that directory (mode 0777)" in str(e.value), str(e.value)
    assert precious.read_bytes() == b"root's own"
    assert sorted(os.listdir(theirs)) == ([] if planted == "none" else [target.name])
    if planted == "file":
        assert target.read_bytes() == b"theirs"


def test_gen_into_a_sticky_directory_of_theirs_is_refused(ctx, sticky, peer, run_cli):
    """Sticky does not help where another account owns the directory: its owner may rename anything in it."""
    (sticky / "theirs").mkdir()
    _as_peer(sticky / "theirs", peer, 0o1777)
    rc, _, err = run_cli("gen", "--native-functions", ctx["native"], "-o", sticky / "theirs" / "g")
    _refused(rc, err, sticky / "theirs")
    rc, _, err = run_cli("lint", ctx["native"], "-o", sticky / "theirs" / "r.txt")
    _refused(rc, err, sticky / "theirs")
    assert os.listdir(sticky / "theirs") == []


def test_a_directory_swapped_in_after_the_check_gets_nothing(ctx, tmp_path, peer, monkeypatch):
    """The directory judged is the one written into: the check before any work passes on a directory
    of root's, the name then leads to theirs, and the write refuses what it opened."""
    from torchgen_patch import files

    mine, swap = tmp_path / "mine", tmp_path / "swap"
    mine.mkdir()
    swap.mkdir()
    _as_peer(swap, peer, 0o777)
    check = files.check_output_file

    def check_then_swap(*a, **kw):
        check(*a, **kw)
        os.rename(mine, tmp_path / "was-mine")
        os.rename(swap, mine)

    monkeypatch.setattr(files, "check_output_file", check_then_swap)
    with pytest.raises(files.InputError, match="tgpeer"):
        files.write_output(str(mine / "report.txt"), b"data\n", "report")
    assert os.listdir(mine) == [] and os.listdir(tmp_path / "was-mine") == []


def test_a_directory_they_make_on_the_way_is_not_entered(sticky, peer):
    """`--output-dependencies` may create its directory: one another account made first (between the
    lookup and the mkdir) is refused, not written into."""
    from torchgen_patch.errors import InputError
    from torchgen_patch.fs.walk import find

    with find(str(sticky / "sub" / "deps.cmake"), "output dependencies") as f:
        (sticky / "sub").mkdir()
        _as_peer(sticky / "sub", peer, 0o777)
        with pytest.raises(InputError, match=r"tgpeer \(uid \d+\) owns that directory \(mode 0777\)"):
            f.make_dirs()
    assert os.listdir(sticky / "sub") == []


def test_roots_output_over_another_accounts_file_is_roots_with_the_umasks_mode(ctx, peer, run_cli):
    """In root's own directory, a file of theirs (0666) that root's output replaces lends it nothing."""
    os.makedirs("home")
    open("home/report.txt", "w").write("old\n")
    _as_peer("home/report.txt", peer, 0o666)
    old = os.umask(0o022)
    try:
        assert run_cli("lint", ctx["native"], "-o", "home/report.txt")[0] == 1
    finally:
        os.umask(old)
    st = os.stat("home/report.txt")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o644) and open("home/report.txt").read() != "old\n"


def test_roots_gen_over_another_accounts_file_makes_it_roots(ctx, peer, run_cli):
    assert run_cli("gen", "--native-functions", ctx["native"], "-o", "g", "--shards", "1")[0] == 0
    register = ctx["tmp"] / "g" / "RegisterADInplaceOrViewPatch.cpp"
    register.write_text("// theirs\n")
    _as_peer(register, peer, 0o666)
    old = os.umask(0o022)
    try:
        assert run_cli("gen", "--native-functions", ctx["native"], "-o", "g", "--shards", "1")[0] == 0
    finally:
        os.umask(old)
    st = os.stat(register)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o644) and register.read_text() != "// theirs\n"


# ---- the writer is not root: a real process of the second account --------------------------------


@pytest.fixture
def as_peer(sticky, peer, run_cli, monkeypatch):
    """Run the CLI in this process as the second account (its effective uid and gid; this Python may
    lie where only root can read), with a yaml and a cache it can read and write."""
    from tests.yaml_fixtures import subset_yaml

    home = sticky / "peer-home"
    home.mkdir()
    native, _ = subset_yaml(str(home), FUNCS)
    for p in (home, *home.iterdir()):
        _as_peer(p, peer)
    os.chmod(home, 0o755)
    assert run_cli("lint", native, "-o", sticky / "warm.txt")[0] == 1  # as root first: every lazy import done
    os.unlink(sticky / "warm.txt")  # (this Python's standard library may lie where only root can read)
    monkeypatch.setenv("TORCHGEN_PATCH_CACHE", str(home / "cache"))
    monkeypatch.chdir(home)

    def run(*argv):
        groups = os.getgroups()
        os.setgroups([])
        os.setegid(peer)
        os.seteuid(peer)
        try:
            return run_cli(*argv)
        finally:
            os.seteuid(0)
            os.setegid(0)
            os.setgroups(groups)

    return run, native, home


def test_another_account_writes_only_where_no_third_one_controls(sticky, as_peer):
    """As a non-root writer: root's 0777 directory (no sticky bit) and a third account's are refused;
    its own 0777 directory and the sticky /tmp-like one of root's take the report."""
    run, native, home = as_peer
    open_to_all = sticky / "open"
    open_to_all.mkdir()
    os.chmod(open_to_all, 0o777)
    nobodys = sticky / "nobodys"
    nobodys.mkdir()
    os.chown(nobodys, 65534, 65534)
    os.chmod(nobodys, 0o777)
    rc, _, err = run("lint", native, "-o", open_to_all / "r.txt")
    _refused(rc, err, open_to_all, owner="root")
    assert "without the sticky bit" in err and os.listdir(open_to_all) == []
    rc, _, err = run("lint", native, "-o", nobodys / "r.txt")
    _refused(rc, err, nobodys, owner="nobody")
    assert os.listdir(nobodys) == []
    own = home / "own"  # its own directory, open to all: its choice
    own.mkdir()
    _as_peer(own, int(os.stat(home).st_uid), 0o777)
    for out in (own / "r.txt", sticky / "r.txt"):
        rc, _, err = run("lint", native, "-o", out)
        assert rc == 1 and os.path.isfile(out), err
