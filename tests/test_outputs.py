"""Outputs you can trust: every output option of the parser goes through the one writer
(devices, FIFOs, ``-`` and symlinks are written through, never replaced; an output that is an
input is refused before any work), and gen's directory is replaced whole or not at all."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import threading

import pytest

from tests.conftest import ROOT
from testbed.trees import tree_from_installed
from tests.yaml_fixtures import subset_yaml
from tests.test_cli_flags import _flags

FUNCS = ["_cummax_helper", "_cummin_helper", "split_with_sizes_copy", "split_with_sizes_copy.out"]
PATH_METAVARS = {"FILE", "DIR", "PATH", "NATIVE_FUNCTIONS_YAML"}
# path-valued options that name something the run reads
INPUTS = {"--native-functions", "--tags", "--pytorch-root", "--overlay", "--baseline", "--generated", "paths",
          "folder"}  # findings DIR
# the folder each process of a program appends its findings to (run, enable): written by the program's
# processes through fs/ (tests/test_saved_fleet.py), never by the command itself
PROCESS_OUTPUTS = {("run", "--findings"), ("enable", "--findings")}


def _path_options() -> set[tuple[str, str]]:
    return _flags(lambda a: a.metavar in PATH_METAVARS or a.dest == "paths")


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return tree_from_installed(str(tmp_path_factory.mktemp("outputs") / "pytorch"), git=False)


@pytest.fixture
def ctx(tmp_path, tree, monkeypatch):
    from torchgen_patch.upstream import issue, pr_body

    (tmp_path / "y").mkdir()
    native, _ = subset_yaml(str(tmp_path / "y"), FUNCS)
    (tmp_path / "fl").mkdir()
    (tmp_path / "fl" / "findings-h-1.jsonl").write_text("{}\n")  # a folder of findings (its one line no record)
    # measuring is not the point
    monkeypatch.setattr(pr_body, "measured", lambda *a, **k: "# the description\n")
    monkeypatch.setattr(issue, "measured", lambda *a, **k: "# the issue\n")
    monkeypatch.chdir(tmp_path)
    return {"native": native, "tree": tree, "tmp": tmp_path, "findings": tmp_path / "fl",
            "codegen": os.path.join(tree, "tools", "autograd", "gen_inplace_or_view_type.py")}


# (command, option) -> (argv writing to X, the input an output must never replace)
FILE_OUTPUTS = {
    ("scan", "--output"): lambda c, x: (["scan", "--native-functions", c["native"], "-o", x], c["native"]),
    ("lint", "--output"): lambda c, x: (["lint", c["native"], "-o", x], c["native"]),
    ("lint", "--write-baseline"): lambda c, x: (["lint", c["native"], "--write-baseline", x], c["native"]),
    ("gen", "--output-dependencies"): lambda c, x: (["gen", "--native-functions", c["native"], "-o", c["tmp"] / "g",
                                                     "--output-dependencies", x], c["native"]),
    ("verify", "--output"): lambda c, x: (["verify", "--native-functions", c["native"], "--backend", "python",
                                           "--op", "aten::_cummax_helper", "--without-patch", "-o", x], c["native"]),
    ("diff", "--output"): lambda c, x: (["diff", "--pytorch-root", c["tree"], "-o", x], c["codegen"]),
    ("diff", "--pr-body"): lambda c, x: (["diff", "--pytorch-root", c["tree"], "-o", c["tmp"] / "d.diff",
                                          "--pr-body", x], c["codegen"]),
    ("diff", "--issue"): lambda c, x: (["diff", "--pytorch-root", c["tree"], "-o", c["tmp"] / "d.diff",
                                        "--issue", x], c["codegen"]),
    ("findings", "--output"): lambda c, x: (["findings", c["findings"], "-o", x], c["findings"] / "findings-h-1.jsonl"),
}
DIR_OUTPUTS = {
    ("gen", "--output"): lambda c, x: ["gen", "--native-functions", c["native"], "-o", x],
    ("wheel", "--output"): lambda c, x: ["wheel", "-o", x],
}


def test_every_path_option_is_an_input_or_a_probed_output():
    """A new option naming a path fails here until it is an input or its writes are probed below."""
    unknown = {f for f in _path_options()
               if f[1] not in INPUTS and f not in FILE_OUTPUTS and f not in DIR_OUTPUTS and f not in PROCESS_OUTPUTS}
    assert not unknown, f"classify these path options (input, or an output probed here): {sorted(unknown)}"
    assert set(FILE_OUTPUTS) | set(DIR_OUTPUTS) <= _path_options()


def _ok(rc, err):
    assert rc in (0, 1), err  # 1: findings, or MISS rows of the run without the patch


def _mknod_null(path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mknod of a character device needs root")
    try:
        os.mknod(str(path), 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError as e:
        pytest.skip(f"mknod refused here: {e.strerror}")


@pytest.mark.parametrize("key", sorted(FILE_OUTPUTS))
def test_char_device_survives(key, ctx, run_cli):
    dev = ctx["tmp"] / "fakenull"
    _mknod_null(dev)
    argv, _ = FILE_OUTPUTS[key](ctx, dev)
    _ok(*run_cli(*argv)[::2])
    assert stat.S_ISCHR(os.lstat(dev).st_mode)
    link = ctx["tmp"] / "stdout-like"  # /dev/stdout is a symlink to a device: neither is replaced
    os.symlink(dev, link)
    argv, _ = FILE_OUTPUTS[key](ctx, link)
    _ok(*run_cli(*argv)[::2])
    assert os.path.islink(link) and stat.S_ISCHR(os.lstat(dev).st_mode)


@pytest.mark.parametrize("key", sorted(FILE_OUTPUTS))
def test_fifo_is_written_through(key, ctx, run_cli):
    fifo = ctx["tmp"] / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    argv, _ = FILE_OUTPUTS[key](ctx, fifo)
    rc, _, err = run_cli(*argv)
    _ok(rc, err)
    reader.join(30)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and got and got[0]


@pytest.mark.parametrize("key", sorted(FILE_OUTPUTS))
def test_symlink_target_is_written_and_link_kept(key, ctx, run_cli):
    target, link = ctx["tmp"] / "real.out", ctx["tmp"] / "link.out"
    target.write_text("old\n")
    os.symlink("real.out", link)
    argv, _ = FILE_OUTPUTS[key](ctx, link)
    _ok(*run_cli(*argv)[::2])
    assert os.path.islink(link) and os.readlink(link) == "real.out"
    assert target.read_text() not in ("", "old\n")


@pytest.mark.parametrize("key", sorted(FILE_OUTPUTS))
def test_dash_is_stdout(key, ctx, run_cli):
    argv, _ = FILE_OUTPUTS[key](ctx, "-")
    rc, out, err = run_cli(*argv)
    _ok(rc, err)
    assert out and not os.path.lexists(ctx["tmp"] / "-")


@pytest.mark.parametrize("key", sorted(FILE_OUTPUTS))
@pytest.mark.parametrize("spelling", ["same", "hardlink", "symlink"])
def test_output_over_an_input_is_refused_before_any_work(key, spelling, ctx, run_cli):
    argv, victim = FILE_OUTPUTS[key](ctx, "X")
    before = open(victim, "rb").read()
    path = victim
    if spelling != "same":
        path = str(ctx["tmp"] / "alias")
        (os.link if spelling == "hardlink" else os.symlink)(victim, path)
    argv, _ = FILE_OUTPUTS[key](ctx, path)
    rc, out, err = run_cli(*argv)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "an input of this run" in err or "which this run reads" in err, err
    assert open(victim, "rb").read() == before
    assert not os.path.exists(ctx["tmp"] / "g") and not os.path.exists(ctx["tmp"] / "d.diff")  # no work done


@pytest.mark.parametrize("key", sorted(DIR_OUTPUTS))
def test_dir_output_refuses_devices_fifos_and_inputs(key, ctx, run_cli):
    fifo = ctx["tmp"] / "pipe"
    os.mkfifo(fifo)
    rc, _, err = run_cli(*DIR_OUTPUTS[key](ctx, fifo))
    assert rc == 2 and "not a directory" in err and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    inside = os.path.join(ctx["tree"], "tools", "autograd") if key[0] == "gen" else None
    if inside:
        argv = ["gen", "--pytorch-root", ctx["tree"], "-o", os.path.join(inside, "gen")]
        rc, _, err = run_cli(*argv)
        assert rc == 2 and "which this run reads" in err and not os.path.exists(os.path.join(inside, "gen"))


def test_gen_into_a_symlinked_directory_keeps_the_link(ctx, run_cli):
    real, link = ctx["tmp"] / "real", ctx["tmp"] / "link"
    real.mkdir()
    os.symlink("real", link)
    assert run_cli(*DIR_OUTPUTS[("gen", "--output")](ctx, link))[0] == 0
    assert os.path.islink(link) and "RegisterADInplaceOrViewPatch.cpp" in os.listdir(real)


# ---------------------------------------------------------------------------
# gen as one transaction


def _whole(d) -> str:
    """'whole' when every output the manifest names is there with its recorded SHA-256 (and the
    manifest names them all); else what is wrong."""
    doc = json.loads(open(os.path.join(d, "torchgen_patch_manifest.json"), "rb").read())
    for name, sha in doc["files"].items():
        p = os.path.join(d, name)
        if not os.path.isfile(p):
            return f"{name} missing"
        if hashlib.sha256(open(p, "rb").read()).hexdigest() != sha:
            return f"{name} differs"
    shards = {n for n in os.listdir(d) if n.startswith("ADInplaceOrViewPatch_")}
    return "whole" if shards == {n for n in doc["files"] if n.startswith("ADInplaceOrViewPatch_")} else "extra shards"


def _two_renders(tmp_path):
    """Two different generated directories' worth of files: 3 kernels in 2 shards, the full plan in 7."""
    from tests.support import scan_of
    from torchgen_patch.codegen import render
    from torchgen_patch.plan import make_plan
    from torchgen_patch.plan.overlay import empty

    (tmp_path / "small").mkdir()
    native, tags = subset_yaml(str(tmp_path / "small"), FUNCS)
    small = render(make_plan(scan_of(native, tags, cache=False), empty()), 2)
    return small, native


def test_concurrent_writers_never_interleave(tmp_path, default_plan):
    from torchgen_patch.codegen import render, write_all

    small, _ = _two_renders(tmp_path)
    big = render(default_plan, 7)
    out = str(tmp_path / "out")
    seen, stop = [], threading.Event()

    def read():
        from torchgen_patch.codegen.output import read_outputs

        while not stop.is_set():
            files = read_outputs(out, sorted(set(small) | set(big)))
            try:
                doc = json.loads(files["torchgen_patch_manifest.json"])
            except (KeyError, ValueError):
                seen.append(False)
                continue
            seen.append(all(hashlib.sha256(files.get(n, b"")).hexdigest() == s for n, s in doc["files"].items()))

    write_all(out, small)
    reader = threading.Thread(target=read)
    reader.start()
    try:
        for _ in range(4):
            ts = [threading.Thread(target=write_all, args=(out, f)) for f in (big, small, big)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            assert _whole(out) == "whole"
    finally:
        stop.set()
        reader.join()
    assert seen and all(seen), f"{seen.count(False)} of {len(seen)} reads saw a mixed directory"
    assert not [n for n in os.listdir(tmp_path) if ".staging-" in n]


def test_concurrent_gen_processes(tmp_path):
    """Two real `gen` runs into one directory at once: it ends wholly one of them."""
    _, native = _two_renders(tmp_path)
    out = str(tmp_path / "out")
    for _ in range(2):
        ps = [subprocess.Popen([sys.executable, "-m", "torchgen_patch", "gen", "-q", "-o", out, *extra], cwd=ROOT,
                               stderr=subprocess.PIPE)
              for extra in (["--shards", "7"], ["--native-functions", native])]
        assert [p.wait() for p in ps] == [0, 0], [p.stderr.read() for p in ps]
        assert _whole(out) == "whole"


@contextlib.contextmanager
def tmpfs(mnt, size: str):
    """A tmpfs of ``size`` mounted on the new directory ``mnt`` while the block runs (a skip where it cannot be)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True,
                       text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_disk_full_leaves_the_old_directory(tmp_path, run_cli):
    """A real full file system (a small tmpfs) in the middle of gen: exit 3 (the environment), and the old
    directory stays whole, with no temporary file or staging directory left."""
    with tmpfs(tmp_path / "mnt", "256k") as mnt:
        _, native = _two_renders(tmp_path)
        out = mnt / "g"
        assert run_cli("gen", "--native-functions", native, "-o", out)[0] == 0
        before = {n: open(out / n, "rb").read() for n in os.listdir(out)}
        rc, _, err = run_cli("gen", "-o", out)  # 177 kernels: about 300 KB, more than is left
        # the machine's problem, not the input's: exit 3, one line naming the file
        assert rc == 3 and len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert f"{out}/" in err and "error: cannot write: No space left on device (hint: free space" in err, err
        assert {n: open(out / n, "rb").read() for n in os.listdir(out)} == before
        assert os.listdir(mnt) == ["g"]
        rc, out_, _ = run_cli("lint", native, "--generated", out)
        assert rc == 0, out_


def test_unchanged_gen_touches_nothing(tmp_path, run_cli):
    out = tmp_path / "g"
    assert run_cli("gen", "-o", out)[0] == 0
    (out / "notes.txt").write_text("mine\n")
    ino = os.stat(out).st_ino
    rc, said, _ = run_cli("gen", "-o", out)  # gen's summary line is on stdout
    assert rc == 0 and "0 of 6 files written" in said and os.stat(out).st_ino == ino
    ov = tmp_path / "o.yaml"
    ov.write_text("aten::_cummax_helper:\n  template: kernel_always_bump.cpp.j2\n")
    keep = os.stat(out / "TorchgenPatchRuntime.h").st_mtime_ns
    assert run_cli("gen", "-o", out, "--overlay", ov)[0] == 0
    assert (out / "notes.txt").read_text() == "mine\n"  # files gen did not write are carried over
    assert os.stat(out / "TorchgenPatchRuntime.h").st_mtime_ns == keep


# ---------------------------------------------------------------------------
# lint --generated passes only on a whole, matching directory


@pytest.fixture
def generated(tmp_path, run_cli):
    out = tmp_path / "g"
    assert run_cli("gen", "-o", out)[0] == 0
    rc, text, _ = run_cli("lint", "--generated", out)
    assert rc == 0 and text.startswith("0 finding(s)"), text
    return out


def _lint_generated(run_cli, out):
    rc, text, _ = run_cli("lint", "--generated", out, "--format", "json")
    return rc, {f["rule"] for f in json.loads(text)["findings"]}


def test_generated_register_file_deleted(generated, run_cli):
    os.unlink(generated / "RegisterADInplaceOrViewPatch.cpp")
    assert _lint_generated(run_cli, generated) == (1, {"generated-file-missing"})


def test_generated_code_appended_to_a_shard(generated, run_cli):
    with open(generated / "ADInplaceOrViewPatch_0.cpp", "a") as fh:
        fh.write("void extra() {}\n")
    assert _lint_generated(run_cli, generated) == (1, {"generated-file-modified"})


def test_generated_register_file_registers_other_kernels(generated, run_cli):
    p = generated / "RegisterADInplaceOrViewPatch.cpp"
    text = p.read_text()
    line = next(ln for ln in text.splitlines(True) if ln.startswith('    {"_cummax_helper", '))
    p.write_text(text.replace(line, ""))
    rc, rules = _lint_generated(run_cli, generated)
    assert rc == 1 and "generated-registration-mismatch" in rules


def test_generated_manifest_without_hashes(generated, run_cli):
    m = generated / "torchgen_patch_manifest.json"
    doc = json.loads(m.read_text())
    del doc["files"]
    m.write_text(json.dumps(doc))
    assert _lint_generated(run_cli, generated) == (1, {"generated-file-modified"})


def test_baseline_over_the_tags_beside_the_yaml_is_refused(ctx, run_cli):
    tags = os.path.join(os.path.dirname(ctx["native"]), "tags.yaml")
    before = open(tags, "rb").read()
    rc, _, err = run_cli("lint", ctx["native"], "--write-baseline", tags)
    shown = os.path.relpath(tags)  # paths are shown relative to the working directory
    assert rc == 2 and err == f"{shown}: error: baseline would overwrite {shown}, an input of this run " \
        "(hint: write it somewhere else)\n"
    assert open(tags, "rb").read() == before
