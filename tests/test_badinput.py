"""Issues 2 and 8: bad input gets one `FILE:LINE: error:` line, exit 2, no
traceback, and the output directory exactly as it was."""

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.support import packaged_yaml

NATIVE, TAGS = packaged_yaml()
FOO = b"- func: foo(Tensor self) -> Tensor\n  variants: function\n"
REAL = open(NATIVE, "rb").read()

# name -> (native_functions.yaml bytes, expected stderr with the file name as 'N')
YAML_CASES = {
    "malformed": (FOO + b"- func: [broken\n", "N:4: error: malformed YAML: did not find expected ',' or ']'"),
    "non_utf8": (FOO + b"\xff\xfe\n", "N:3: error: native_functions.yaml is not valid UTF-8 (byte 0xff)"),
    "garbage": (b"\x00\x01\x02\xfa\xfb" * 50, "N:1: error: native_functions.yaml is not valid UTF-8 (byte 0xfa)"),
    "empty": (b"", "N:1: error: native_functions.yaml must be a non-empty YAML list of entries"),
    "only_comment": (b"# nothing here\n", "N:1: error: native_functions.yaml must be a non-empty YAML list of entries"),
    "mapping": (b"func: foo(Tensor self) -> Tensor\n",
                "N:1: error: native_functions.yaml must be a non-empty YAML list of entries"),
    "scalar_entry": (b"- just a string\n",
                     "N:1: error: native_functions.yaml: every entry must be a mapping, got str"),
    "no_func": (FOO + b"- variants: function\n", "N:3: error: entry has no 'func:' schema string"),
    "func_not_string": (b"- func: [1, 2]\n", "N:1: error: entry has no 'func:' schema string"),
    "bad_schema": (b"- func: foo(Tensor self -> Tensor\n  variants: function\n",
                   "N:1: error: the installed torchgen rejected this file: Invalid function schema: foo(Tensor self "
                   "-> Tensor "
                   "(hint: is the yaml from a torch release this torchgen can read?)"),
    "bad_type": (b"- func: foo(Tensr self) -> Tensor\n",
                 "N:1: error: the installed torchgen rejected this file: unrecognized type Tensr "
                 "(hint: is the yaml from a torch release this torchgen can read?)"),
    "duplicate": (FOO + b"\n" + FOO, "N:4: error: duplicate operator 'foo' (hint: first defined at line 1)"),
    "unknown_tag": (FOO + b"  tags: not_a_tag\n",
                    "N:1: error: the installed torchgen rejected this file: illegal tag not_a_tag "
                    "(hint: is the yaml from a torch release this torchgen can read?)"),
    "unknown_key": (FOO + b"  dispatchh: {CPU: foo}\n",
                    "N:1: error: the installed torchgen rejected this file: leftover entries: "
                    "{'dispatchh': {'CPU': 'foo', '__line__': 3}} "
                    "(hint: is the yaml from a torch release this torchgen can read?)"),
    "inplace_must_return_self": (b"- func: foo_(Tensor(a!) self) -> ()\n",
                                 "N:1: error: the installed torchgen rejected this file: Inplace op foo_ with Tensor "
                                 "self must "
                                 "return self (hint: is the yaml from a torch release this torchgen can read?)"),
    "duplicate_key": (FOO + b"  variants: method\n",
                      "N:1: error: malformed YAML: duplicate key 'variants'"),
    "unknown_dispatch_key": (FOO + b"  dispatch:\n    CPUU: foo\n",
                             "N:1: error: the installed torchgen rejected this file: unknown dispatch key CPUU "
                             "(hint: is the yaml from a torch release this torchgen can read?)"),
    "truncated_mid_schema": (REAL[: REAL.index(b"- func: _cast_Double") + 24],
                             "N:17: error: the installed torchgen rejected this file: Invalid function schema: "
                             "_cast_Double(Ten "
                             "(hint: is the yaml from a torch release this torchgen can read?)"),
    "tab_indent": (b"- func: foo(Tensor self) -> Tensor\n\tvariants: function\n",
                   "N:2: error: malformed YAML: found a tab character that violates indentation"),
}


def _case_files(tmp_path, name, data):
    d = tmp_path / name
    d.mkdir()
    (d / "native_functions.yaml").write_bytes(data)
    (d / "tags.yaml").write_bytes(open(TAGS, "rb").read())
    return d / "native_functions.yaml"


def _snapshot(d):
    return {p: open(os.path.join(d, p), "rb").read() for p in sorted(os.listdir(d))}


@pytest.mark.parametrize("name", sorted(YAML_CASES))
@pytest.mark.parametrize("cmd", ["lint", "gen"])
def test_bad_native_functions(tmp_path, run_cli, name, cmd):
    data, expected = YAML_CASES[name]
    native = _case_files(tmp_path, name, data)
    own = _installed_torchgen_refusal("foo_(Tensor(a!) self) -> ()") if name == "inplace_must_return_self" else None
    if own == "":  # torch 2.4's torchgen refuses it with a bare assert: the check's own line is shown
        expected = re.escape(expected.replace("N:", f"{native}:", 1)).replace(
            re.escape("Inplace op foo_ with Tensor self must return self"),
            r"failed check `assert.*` \(torchgen/[\w/]+\.py:\d+\)") + "\n"
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("untouched")
    before = _snapshot(out)
    extra = ["--out", out] if cmd == "gen" else []
    rc, stdout, stderr = run_cli(cmd, "--native-functions", native, "--no-cache", *extra)
    assert rc == 2
    assert stdout == ""
    if own == "":
        assert re.fullmatch(expected, stderr), stderr
    else:
        assert stderr == expected.replace("N:", f"{native}:", 1) + "\n"
    assert _snapshot(out) == before


def _installed_torchgen_refusal(schema: str) -> str:
    """The installed torchgen's own message refusing ``schema`` ("" for a bare assert)."""
    from torchgen.model import FunctionSchema

    with pytest.raises(AssertionError) as e:
        FunctionSchema.parse(schema)
    return str(e.value)


@pytest.mark.parametrize("argv,expected", [
    (["lint", "--native-functions", "/nonexistent/native_functions.yaml"],
     "/nonexistent/native_functions.yaml: error: native_functions.yaml not found"),
    (["lint", "--native-functions", "/tmp"], "/tmp: error: native_functions.yaml is a directory, expected a file"),
    (["lint", "--native-functions", NATIVE, "--tags", "/nonexistent/tags.yaml"],
     "/nonexistent/tags.yaml: error: tags.yaml not found"),
    (["lint", "--tags", TAGS], "torchgen-patch: error: --tags needs --native-functions"),
    (["lint", "--pytorch-root", "/nonexistent"], "/nonexistent: error: --pytorch-root is not a directory"),
    (["lint", "--pytorch-root", "/tmp"], "/tmp: error: not a PyTorch checkout: "
                                          "aten/src/ATen/native/native_functions.yaml is missing "
                                          "(hint: is the checkout complete?)"),
    (["lint", "--overlay", "/nonexistent.yaml"], "/nonexistent.yaml: error: overlay not found"),
    (["gen", "--out", "/tmp/x", "--shards", "0"],
     "torchgen-patch: error: --shards must be between 1 and 256, not 0 (hint: PyTorch's own codegen uses 5 "
     "shards for ~1,100 kernels)"),
])
def test_bad_arguments(run_cli, argv, expected):
    rc, out, err = run_cli(*argv)
    assert (rc, out, err) == (2, "", expected + "\n")


def test_output_path_is_a_file(run_cli, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    rc, out, err = run_cli("gen", "--out", f)
    assert rc == 2 and err == f"{f}: error: output path exists and is not a directory\n"
    assert f.read_text() == "x"


def test_write_failure_leaves_output_as_it_was(run_cli, tmp_path, monkeypatch):
    """A failure injected in the file layer (a full disk, say) on the third file."""
    from torchgen_patch.fs import atomic as write

    out = tmp_path / "out"
    rc, _, _ = run_cli("gen", "--out", out)
    assert rc == 0
    before = _snapshot(out)
    # change the input so that every file would be rewritten, then fail mid-way
    ov = tmp_path / "o.yaml"
    ov.write_text("aten::_cummax_helper:\n  template: kernel_always_bump.cpp.j2\n")
    calls = {"n": 0}
    real = write.atomic_write

    def failing(path, data, durable=True):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        return real(path, data, durable)

    monkeypatch.setattr(write, "atomic_write", failing)
    rc, out_, err = run_cli("gen", "--out", out, "--overlay", ov)
    assert rc == 3  # a full disk is the environment's problem
    assert err.endswith(": error: cannot write: No space left on device (hint: free space on that file system, "
                        "or write elsewhere)\n"), err
    after = _snapshot(out)
    # the directory is replaced whole or not at all: here, wholly the old one, and nothing left beside it
    assert after == before
    assert not [p for p in os.listdir(out) if p.startswith(".tmp-")]
    assert sorted(os.listdir(tmp_path)) == ["o.yaml", "out"]  # no staging directory left beside it


def test_no_traceback_in_a_real_process(tmp_path):
    native = _case_files(tmp_path, "bad", YAML_CASES["bad_schema"][0])
    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "gen", "--native-functions", str(native),
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv,expected", [
    (["verify", "--backend", "python", "--op", "aten::_foreach_zero_", "-o", "/no/such/dir/v.md"],
     "/no/such/dir/v.md: error: cannot write report: directory /no/such/dir does not exist"),
    (["verify", "--backend", "python", "--op", "aten::_foreach_zero_", "-o", "/tmp"],
     "/tmp: error: report is a directory, expected a file name"),
    (["lint", "--write-baseline", "/no/such/dir/b.json"],
     "/no/such/dir/b.json: error: cannot write baseline: directory /no/such/dir does not exist"),
    (["diff", "--pytorch-root", "TREE", "-o", "/nonexistent/x.diff"],
     "/nonexistent/x.diff: error: cannot write diff: directory /nonexistent does not exist"),
    (["scan", "-o", "/no/such/dir/s.txt"],
     "/no/such/dir/s.txt: error: cannot write scan report: directory /no/such/dir does not exist"),
    (["lint", "-o", "/tmp"], "/tmp: error: lint report is a directory, expected a file name"),
    (["diff", "--pytorch-root", "TREE", "-o", "OUT", "--pr-body", "/nonexistent/pr.md"],
     "/nonexistent/pr.md: error: cannot write description: directory /nonexistent does not exist"),
    (["gen", "--out", "/etc/passwd"], "/etc/passwd: error: output path exists and is not a directory"),
    (["wheel", "-o", "/etc/passwd"], "/etc/passwd: error: output path exists and is not a directory"),
    (["wheel", "-o", "/etc/passwd/dist"],
     "/etc/passwd/dist: error: cannot create output directory: /etc/passwd is not a directory"),
    (["gen", "--out", "OUT", "--output-dependencies", "/etc/passwd/d.cmake"],
     "/etc/passwd: error: output path exists and is not a directory"),
])
def test_every_output_path_is_checked_before_any_work(run_cli, tmp_path, argv, expected):
    from testbed.upstream_tree import make_tree

    tree = make_tree(str(tmp_path / "tree")) if "TREE" in argv else None
    argv = [tree if a == "TREE" else str(tmp_path / "out") if a == "OUT" else a for a in argv]
    rc, out, err = run_cli(*argv)
    assert (rc, out, err) == (2, "", expected + "\n")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv,expected", [
    (["scan", "--verdict", "mising"], "argument --verdict: invalid choice: 'mising'"),
    (["lint", "--baseline", "A", "--write-baseline", "B"], "argument --write-baseline: not allowed with argument "
                                                            "--baseline"),
    (["lint", "--write-baseline", "B", "-o", "R"], "--write-baseline writes the baseline, not a report"),
    (["gen", "-o", "OUT", "--overlay", "x.yaml", "--no-overlay"], "--overlay and --no-overlay exclude each other"),
    (["gen", "-o", "OUT", "--dry-run"], "--dry-run writes only the --output-dependencies file"),
    (["diff", "--pytorch-root", ".", "--check", "-o", "R"], "--check writes no diff"),
    (["verify", "-q", "-v"], "argument -v/--verbose: not allowed with argument -q/--quiet"),
    (["verify", "--format", "tabel"], "argument --format: invalid choice: 'tabel'"),
    (["lint", "--import", "os"], "--import and --namespace go with --runtime"),
    (["run", "--import", "os", "--", "true"], "--import goes with --runtime-op"),
])
def test_conflicting_or_unknown_flags_are_one_line_and_write_nothing(argv, expected, tmp_path, capfd):
    """Flags that contradict each other, or values outside their choices: one error line, exit 2,
    no output file."""
    from torchgen_patch import cli

    argv = [str(tmp_path / "out") if a == "OUT" else str(tmp_path / a) if a in ("R", "B") else a for a in argv]
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    out, err = capfd.readouterr()
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and expected in err, err
    assert sorted(os.listdir(tmp_path)) == []
