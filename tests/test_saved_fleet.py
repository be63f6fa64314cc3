"""Findings of a fleet: every process of a job appends each finding of the saved-tensor check to a file
of its own in one folder (``--findings DIR``, ``$TORCHGEN_PATCH_FINDINGS``, ``check_saved(findings=)``),
and ``torchgen-patch findings DIR`` groups them by site in text, JSON and markdown (goldens in
tests/golden/formats/findings.*). The folder is input: a damaged or half-written line, a symlink, a
FIFO are one error line each and are skipped, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT
from tests.regen_goldens import GOLDEN, fleet_goldens, fleet_records
from torchgen_patch.saved import fleet
from torchgen_patch.saved.finding import Finding, Frame
from torchgen_patch.saved.fleet import Folder, Record
from torchgen_patch.vocabulary import Writer

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="another account's files need root to make")


def _cli(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "torchgen_patch", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=dict(os.environ, PYTHONPATH=ROOT, **(env or {})))


def _finding(**kw) -> Finding:
    base = dict(shape=(4, 3), dtype="float32", device="cpu", version=1, name="weight", owner="Linear", view=True,
                node="AddmmBackward0", forward=Frame("prog.py", 6, "<module>"),
                backward=Frame("prog.py", 8, "<module>"),
                writers=(Writer.DATA, Writer.ALIAS, Writer.KERNEL), rank=0)
    return Finding(**{**base, **kw})


# ---- the report: goldens ------------------------------------------------------------------------------

def test_the_findings_goldens_are_current():
    """Fails when a renderer of `findings` changed: run `make goldens` and review the diff."""
    made = fleet_goldens()
    assert sorted(made) == sorted(f"formats/{n}" for n in os.listdir(os.path.join(GOLDEN, "formats"))
                                  if n.startswith("findings."))
    for name, data in made.items():
        with open(os.path.join(GOLDEN, name), "rb") as fh:
            assert fh.read() == data, f"stale golden: {name} (run `make goldens`)"


def test_the_goldens_group_by_site_with_processes_ranks_and_steps():
    text = open(os.path.join(GOLDEN, "formats/findings.text"), encoding="utf-8").read()
    assert text.splitlines()[0] == ("torchgen-patch findings: 5 sites, 15 findings from 3 processes on 2 hosts "
                                    "(node-a, node-b), 2 ranks (0-1); 3 files read, 1 file or line skipped")
    assert ("1. saved by MmBackward0 in the forward call at train.py:41 (forward)\n"
            "   found by 2 processes on 2 hosts (node-a, node-b), 2 ranks (0-1), at 3 steps (first 3, last 5): "
            "7 findings\n") in text
    assert "\x1b" not in text and "run\\n.py:3" in text  # a name from input stays on its line, inert
    assert "   tensor:  `blocks.2.w` of Net<b> (float32[8, 8] on cpu)\n            and 2 other tensors\n" in text
    data = json.loads(open(os.path.join(GOLDEN, "formats/findings.json"), encoding="utf-8").read())
    first = data["sites"][0]
    assert (first["saved_by"], first["processes"], first["ranks"], first["steps"], first["first_step"]) == \
        ("MmBackward0", 2, [0, 1], 3, 3)
    assert data["skipped"] == 1 and first["writers"][0] == "optimizer"
    md = open(os.path.join(GOLDEN, "formats/findings.markdown"), encoding="utf-8").read()
    assert "| 1 | `MmBackward0` | `train.py:41 (forward)` | 2 | 0-1 | 3 | 3 | 7 |" in md
    assert "Net<b>" not in md and "of Net&lt;b&gt; (float32[8, 8] on cpu)<br>and 2 other tensors |" in md  # no markup
    assert len(data["sites"][1]["tensors"]) == 5


# ---- a line: written whole, read back checked ------------------------------------------------------------

def test_a_record_is_one_line_that_reads_back_as_it_was():
    r = Record("node-a", 42, 3, _finding(site=Frame("lib/x.py", 2, "f"), optimizer="torch.optim.AdamW", rank=None,
                                         name="a\nb\u202e"))
    line = r.to_line()
    assert line.endswith(b"\n") and line.count(b"\n") == 1 and line.isascii()
    assert Record.parse(line[:-1]) == r


@pytest.mark.parametrize("change, message", [
    ({"v": 2}, "not a findings line of this torchgen-patch ('v' is 2, not 1)"),
    ({"pid": "42"}, "'pid' is a str, not a count"),
    ({"pid": True}, "'pid' is a bool, not a count"),
    ({"step": -1}, "'step' is a int, not a count"),
    ({"host": ""}, "'host' is a str, not a string"),
    ({"tensor": [1]}, "'tensor' is a list, not an object"),
    ({"writers": ["cosmic rays"]}, "'writers' names 'cosmic rays', which is no writer"),
    ({"forward": {"file": "x.py", "line": "1", "function": "f"}}, "'forward.line' is a str, not a count"),
])
def test_a_line_is_checked_field_by_field(change, message):
    obj = json.loads(Record("h", 1, 0, _finding()).to_line())
    obj.update(change)
    with pytest.raises(ValueError) as e:
        Record.parse(json.dumps(obj).encode())
    assert str(e.value) == message
    for garbage in (b"\xff\xfe", b"[1, 2]", b"{" * 100_000):
        with pytest.raises(ValueError):
            Record.parse(garbage)


# ---- the folder read back: whatever is in it is input --------------------------------------------------------

def _fleet_dir(tmp_path):
    d = tmp_path / "fleet"
    d.mkdir()
    for name, data in fleet_records().items():
        (d / name).write_bytes(data)
    return d


def test_findings_groups_a_folder_and_each_damaged_entry_is_one_error_line(tmp_path):
    d = _fleet_dir(tmp_path)
    (d / "findings-x-1.jsonl").write_bytes(Record("x", 1, 0, _finding()).to_line() + b"garbage\n\n"
                                           + json.dumps({"v": 1}).encode() + b"\n")
    (d / "elsewhere.jsonl").symlink_to(d / "findings-x-1.jsonl")
    os.mkfifo(d / "pipe.jsonl")  # opened without waiting, never read
    (d / "sub.jsonl").mkdir()
    (d / "notes.txt").write_text("not a findings file: not read\n")
    r = _cli("findings", "fleet", cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [
        "fleet/elsewhere.jsonl: error: a symlink: not followed",
        "fleet/findings-node-b-202.jsonl:5: error: a line cut short (no newline at its end): skipped",
        "fleet/findings-x-1.jsonl:2: error: not a findings line: not JSON (Expecting value: line 1 column 1 (char 0)): "
        "skipped",
        "fleet/findings-x-1.jsonl:4: error: not a findings line: 'tensor' is missing, not an object: skipped",
        "fleet/pipe.jsonl: error: not a regular file: not read",
        "fleet/sub.jsonl: error: not a regular file: not read"]
    assert r.stdout.startswith("torchgen-patch findings: 6 sites, 16 findings from 4 processes on 3 hosts "
                               "(node-a, node-b, x), 2 ranks (0-1); 4 files read, 6 files or lines skipped\n")
    for fmt in ("json", "markdown"):
        out = _cli("findings", "fleet", "--format", fmt, "-o", f"report.{fmt}", cwd=tmp_path)
        assert out.returncode == 1 and len(out.stderr.splitlines()) == 7, out.stderr  # and the line naming -o
    assert json.loads((tmp_path / "report.json").read_text())["processes"] == 4
    assert (tmp_path / "report.markdown").read_text().startswith("# Saved tensors written behind autograd's back\n")


def test_an_empty_folder_has_no_site_and_exits_0_a_missing_one_is_one_error(tmp_path):
    (tmp_path / "empty").mkdir()
    r = _cli("findings", "empty", cwd=tmp_path)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == ("torchgen-patch findings: no saved tensor was written behind autograd's back: no finding in "
                        "0 files\n")
    (tmp_path / "file").write_text("")
    for name, why in (("missing", "cannot read the directory: No such file or directory"),
                      ("file", "not a directory")):
        r = _cli("findings", name, cwd=tmp_path)
        assert (r.returncode, r.stdout, r.stderr) == (2, "", f"{name}: error: {why}\n")


def test_a_file_over_the_bound_is_not_read(tmp_path, monkeypatch):
    from torchgen_patch.checks import fleet as reader

    d = _fleet_dir(tmp_path)
    sizes = {p.name: p.stat().st_size for p in d.glob("*.jsonl")}
    smallest = min(sizes, key=lambda n: sizes[n])
    limit = sizes[smallest]  # the smallest file is read whole, every larger one is not
    monkeypatch.setattr(reader, "LIMIT", limit)
    records, problems, files = reader.read(str(d))
    over = sorted(n for n, size in sizes.items() if size > limit)
    assert len(over) >= 2
    assert [(os.path.basename(p.path), p.line, p.message) for p in problems] == [
        (n, None, f"larger than {limit} bytes: not read") for n in over]
    assert files == len(sizes) - len(over)
    assert len(records) == (d / smallest).read_bytes().count(b"\n")


@ROOT_ONLY
def test_another_accounts_file_is_read_as_input(tmp_path):
    d = _fleet_dir(tmp_path)
    for name in os.listdir(d):
        os.chown(d / name, 4242, 4242)
    r = _cli("findings", d, "--format", "json")
    assert r.returncode == 1 and json.loads(r.stdout)["findings"] == 15


# ---- the writer ------------------------------------------------------------------------------------------------

def test_a_process_writes_its_findings_whole_to_a_file_of_its_own(tmp_path, capsys):
    w = Folder(str(tmp_path / "new" / "fleet"))
    w.write(_finding())
    w.write(_finding(rank=1))
    (name,) = os.listdir(tmp_path / "new" / "fleet")
    assert name == f"findings-{fleet.HOST}-{os.getpid()}.jsonl"
    path = tmp_path / "new" / "fleet" / name
    assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0 and stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    lines = path.read_bytes().splitlines()
    assert [Record.parse(x) for x in lines] == [Record(fleet.HOST, os.getpid(), None, _finding()),
                                               Record(fleet.HOST, os.getpid(), None, _finding(rank=1))]
    assert capsys.readouterr().err == ""


def test_a_name_already_taken_is_left_alone(tmp_path):
    """A symlink (or an earlier process's file) at the name: the writer takes another name, follows nothing."""
    target = tmp_path / "target"
    target.write_text("theirs\n")
    (tmp_path / "d").mkdir(mode=0o700)
    (tmp_path / "d" / f"findings-{fleet.HOST}-{os.getpid()}.jsonl").symlink_to(target)
    Folder(str(tmp_path / "d")).write(_finding())
    assert target.read_text() == "theirs\n"
    made = [n for n in os.listdir(tmp_path / "d") if not os.path.islink(tmp_path / "d" / n)]
    assert len(made) == 1 and made[0].startswith(f"findings-{fleet.HOST}-{os.getpid()}-")


@pytest.mark.parametrize("mode, written", [(0o770, False), (0o1777, True), (0o700, True)])
def test_a_folder_others_can_write_is_refused_once_and_the_program_goes_on(tmp_path, capsys, mode, written):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, mode)
    w = Folder(str(d))
    for _ in range(3):
        w.write(_finding())
    assert bool(os.listdir(d)) == written
    err = capsys.readouterr().err
    if written:
        assert err == ""
    else:
        assert err == (f"torchgen-patch: findings of pid {os.getpid()} not written to {d}: {d} is writable by its "
                       f"group (mode 0770): they could replace what is there, so torchgen-patch writes no findings "
                       f"under {d}; the check goes on\n")


@ROOT_ONLY
def test_a_folder_of_another_account_is_not_written_through(tmp_path, capsys):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o755)
    os.chown(d, 4242, 4242)
    Folder(str(d)).write(_finding())
    assert os.listdir(d) == []
    said = capsys.readouterr().err
    assert "is owned by uid 4242, not by you or root: torchgen-patch writes no findings under" in said


def test_a_forked_child_writes_a_file_of_its_own(tmp_path):
    w = Folder(str(tmp_path))
    w.write(_finding())
    child = os.fork()
    if child == 0:  # a DataLoader worker, say, whose backward finds something too
        try:
            w.write(_finding(rank=5))
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    w.write(_finding(rank=1))
    files = {n: [Record.parse(x) for x in (tmp_path / n).read_bytes().splitlines()] for n in os.listdir(tmp_path)}
    assert files == {f"findings-{fleet.HOST}-{os.getpid()}.jsonl": [Record(fleet.HOST, os.getpid(), None, _finding()),
                                                                   Record(fleet.HOST, os.getpid(), None,
                                                                          _finding(rank=1))],
                     f"findings-{fleet.HOST}-{child}.jsonl": [Record(fleet.HOST, child, None, _finding(rank=5))]}


def test_a_line_written_in_part_is_taken_back_and_said_once(tmp_path, monkeypatch, capsys):
    from torchgen_patch.fs import appends

    w = Folder(str(tmp_path))
    w.write(_finding())
    real = os.write
    monkeypatch.setattr(appends.os, "write", lambda fd, data: real(fd, data[:10]))  # a full disk, mid-line
    w.write(_finding(rank=1))
    w.write(_finding(rank=2))
    (name,) = os.listdir(tmp_path)
    data = (tmp_path / name).read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == 1  # the part written is gone: no damaged line
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "bytes of a line were written; the check goes on" in err[0]


def test_a_process_writes_at_most_so_many_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(fleet, "MAX_LINES", 2)
    w = Folder(str(tmp_path))
    for _ in range(5):
        w.write(_finding())
    (name,) = os.listdir(tmp_path)
    assert len((tmp_path / name).read_bytes().splitlines()) == 2
    assert capsys.readouterr().err.count("2 findings written, the rest of this process's are not") == 1


# ---- the check writes there --------------------------------------------------------------------------------------

PROGRAM = textwrap.dedent("""
    import os, torch
    import torch.distributed as dist
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    m = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4, requires_grad=True)
    for _ in range(3):
        loss = (m(x) * 2).sum()
        m.weight.data.mul_(2)
        loss.backward()
    if dist.is_initialized():
        dist.destroy_process_group()
    print("done")
""")


def _train(check):
    import torch

    m = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4, requires_grad=True)
    with check:
        for _ in range(3):
            loss = (m(x) * 2).sum()
            m.weight.data.mul_(2)
            loss.backward()


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_the_check_writes_each_finding_with_its_step(tmp_path, monkeypatch, how):
    from torchgen_patch.saved import check_saved

    if how == "environment":
        monkeypatch.setenv(fleet.ENV, str(tmp_path))
    _train(check_saved("warn", "python", findings=str(tmp_path) if how == "argument" else None))
    (name,) = os.listdir(tmp_path)
    records = [Record.parse(x) for x in (tmp_path / name).read_bytes().splitlines()]
    assert len(records) == 3 and {r.finding.node for r in records} == {"AddmmBackward0"}
    steps = [r.step for r in records]
    assert steps == list(range(steps[0], steps[0] + 3))  # the process's backward passes, one a step
    assert fleet.step() is None  # outside a backward pass


def test_raise_writes_its_finding_before_it_raises(tmp_path):
    from torchgen_patch.saved import SavedTensorChanged, check_saved

    with pytest.raises(SavedTensorChanged):
        _train(check_saved("raise", "python", findings=str(tmp_path)))
    (name,) = os.listdir(tmp_path)
    (line,) = (tmp_path / name).read_bytes().splitlines()
    assert Record.parse(line).finding.node == "AddmmBackward0"


def test_whatever_the_writer_meets_the_program_goes_on(tmp_path, monkeypatch, capsys):
    def broken():
        raise RuntimeError("no engine")

    monkeypatch.setattr(fleet, "step", broken)
    w = Folder(str(tmp_path))
    w.write(_finding())
    w.write(_finding())
    assert capsys.readouterr().err.count("RuntimeError: no engine; the check goes on\n") == 1


def test_without_a_folder_nothing_is_written(tmp_path, monkeypatch):
    from torchgen_patch.saved import check_saved

    monkeypatch.delenv(fleet.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    _train(check_saved("warn", "python"))
    assert os.listdir(tmp_path) == []


# ---- the launch spec and the flags ------------------------------------------------------------------------------

def test_the_launch_spec_carries_the_folder_and_older_specs_still_read():
    import dataclasses

    from torchgen_patch.runtime.launch.launcher import launch_spec
    from torchgen_patch.runtime.launch.spec import LaunchSpec
    from torchgen_patch.sources import Options

    spec = launch_spec(Options(), "cpp", None, [], [], check_saved="warn", findings="/shared/fleet")
    assert LaunchSpec.parse(spec.to_json(), "$X").findings == "/shared/fleet"
    older = dataclasses.replace(spec, findings=None)
    assert "findings" not in older.to_dict() and LaunchSpec.parse(older.to_json(), "$X") == older
    bad = json.dumps({**spec.to_dict(), "findings": "fleet"})
    with pytest.raises(Exception, match="'findings' is not an absolute path"):
        LaunchSpec.parse(bad, "$X")


def test_run_and_enable_take_findings():
    from torchgen_patch.cli.parser import parser

    for cmd in ("run", "enable"):
        assert parser().parse_args([cmd, "--findings", "d"]).findings == "d"
    args = parser().parse_args(["findings", "d", "--format", "markdown"])
    assert (args.folder, args.format) == ("d", "markdown")


def test_run_refuses_a_folder_others_can_write_before_the_program_starts(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    marker = tmp_path / "started"
    r = _cli("run", "--findings", d, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    assert r.returncode == 3 and not marker.exists()
    assert r.stderr.startswith(f"torchgen-patch: error: {d} is writable by group and others (mode 0777)")


# ---- a fleet: two ranks under torchrun and one more process ---------------------------------------------------------

FLEET_TEXT = """\
torchgen-patch findings: 1 site, 9 findings from 3 processes on 1 host (vm), 2 ranks (0-1); 3 files read

1. saved by AddmmBackward0 in the forward call at prog.py:9 (<module>)
   found by 3 processes on 1 host (vm), 2 ranks (0-1), at 3 steps (first 0, last 2): 9 findings
   tensor:  a view of `weight` of Linear (float32[4, 3] on cpu)
   used by: the backward call at prog.py:11 (<module>)
   likely written by: an in-place op on `.data` (`p.data.mul_(2)`: `.data` has a version counter of its own)
"""


def _torchrun() -> str | None:
    here = os.path.join(os.path.dirname(sys.executable), "torchrun")
    return shutil.which("torchrun") or (here if os.path.exists(here) else None)


@pytest.mark.build
@pytest.mark.skipif(_torchrun() is None, reason="torchrun is not installed")
def test_two_ranks_and_a_process_write_to_one_folder_and_findings_makes_one_site(library, tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    ranks = _cli("run", "--check-saved", "--findings", "fleet", "--", _torchrun(), "--nproc-per-node", "2",
                 "--master-port", "29531",
                 "prog.py", cwd=tmp_path)
    assert ranks.returncode == 0 and ranks.stdout.count("done") == 2, ranks.stderr[-3000:]
    alone = _cli("run", "--check-saved", "--", sys.executable, "prog.py", cwd=tmp_path,
                 env={fleet.ENV: str(tmp_path / "fleet")})
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert len(os.listdir(tmp_path / "fleet")) == 3  # a file each process that found something; none for torchrun's own
    for fmt in ("text", "json", "markdown"):
        r = _cli("findings", "fleet", "--format", fmt, cwd=tmp_path)
        assert r.returncode == 1 and r.stderr == "", r.stderr
        if fmt == "json":
            (site,) = json.loads(r.stdout)["sites"]
            assert (site["saved_by"], site["forward"]["file"], site["forward"]["line"]) \
                == ("AddmmBackward0", "prog.py", 9)
            assert (site["processes"], site["ranks"], site["findings"], site["steps"]) == (3, [0, 1], 9, 3)
        elif fmt == "text":  # as docs/unseen-writes.md shows it
            assert r.stdout.replace(f"({fleet.HOST})", "(vm)") == FLEET_TEXT
