"""Honest answers: a lint that can only pass is refused, what the overlay leaves out is said in
every format, verify's exit code is a detector, and lint takes yaml paths the way lintrunner
and pre-commit pass them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.support import packaged_yaml

NATIVE, TAGS = packaged_yaml()


@pytest.mark.parametrize("ns", ["no_such_namespace", ""])
def test_runtime_namespace_with_no_ops_is_refused(run_cli, ns):
    rc, out, err = run_cli("lint", "--runtime", "--namespace", ns)
    assert rc == 2 and out == "" and len(err.splitlines()) == 1, err
    assert f"--namespace {ns!r}: no operator" in err and "aten" in err and "--import" in err


def test_fsdp_without_its_import_is_refused():
    """In a fresh process (this one may have imported FSDP already): FSDP2's operators exist only
    once torch.distributed.fsdp is imported, so a CI job linting them without --import fails."""
    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "lint", "--runtime", "--namespace", "fsdp"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and r.stdout == "" and "--import MODULE" in r.stderr, r.stderr


@pytest.fixture
def skipping_overlay(tmp_path):
    import testbed.custom_ops  # noqa: F401  (defines tgp_test::write_one and its siblings)

    ov = tmp_path / "o.yaml"
    ov.write_text("tgp_test::write_one:\n  action: skip\n  reason: probe\n")
    return ov


@pytest.mark.parametrize("fmt,said", [
    ("text", lambda out: out.endswith("; left out by the overlay: 1\n")),
    ("json", lambda out: json.loads(out)["left_out_by_overlay"] == 1),
    ("lintrunner", lambda out: json.loads(out.splitlines()[-1])["description"] == "left out by the overlay: 1"),
    ("sarif", lambda out: json.loads(out)["runs"][0]["properties"]["leftOutByOverlay"] == 1),
    ("github", lambda out: out.splitlines()[-1] == "::notice title=VERSIONCOUNTER::left out by the overlay: 1"),
])
def test_runtime_left_out_by_the_overlay_in_every_format(run_cli, skipping_overlay, fmt, said):
    rc, out, err = run_cli("lint", "--runtime", "--namespace", "tgp_test", "--overlay", skipping_overlay,
                           "--format", fmt)
    assert rc in (0, 1), err
    assert said(out), out
    assert "tgp_test::write_one:" not in out  # left out, counted, not reported


def test_verify_without_patch_is_a_detector(run_cli):
    rc, out, err = run_cli("verify", "--backend", "python", "--without-patch", "--op", "aten::_fused_adamw_")
    assert "MISS" in out and rc == 1, (out, err)
    assert "verify: aten::_fused_adamw_: MISS" in err


@pytest.fixture
def unpatched_after():
    """verify installs the kernels in this process: each test ends with them removed again."""
    import torchgen_patch

    torchgen_patch.uninstall()
    yield
    torchgen_patch.uninstall()


def test_verify_both_exits_by_the_run_with_the_patch(run_cli, tmp_path, unpatched_after):
    """The run without the patch is the report's "before" column: its MISS rows are evidence, said
    once and labelled, never an exit code of 1 nor a bare per-op failure line."""
    import torchgen_patch

    V = ("verify", "--backend", "python", "--both", "--op", "aten::_fused_adamw_")
    rc, out, err = run_cli(*V, "-o", tmp_path / "v.md", "--format", "markdown")
    assert rc == 0, err
    assert out == ("verify (cpu) before, without patch: MISS 1\n"
                   "verify (cpu) after, with patch (python): PASS 1\n")
    assert "aten::_fused_adamw_" not in err
    assert "without patch, MISS (1): `aten::_fused_adamw_`" in (tmp_path / "v.md").read_text()  # still reported
    torchgen_patch.uninstall()
    rc, out, err = run_cli(*V)  # the table on stdout: the before run's counts said on stderr
    assert rc == 0 and "== without patch" in out and "MISS" in out
    assert err == "verify: before, without patch: MISS 1 (evidence; the exit code is the run with the patch's)\n"


def test_verify_quiet_prints_only_what_failed(run_cli, unpatched_after):
    rc, out, err = run_cli("verify", "--backend", "python", "-q", "--without-patch", "--op", "aten::_fused_adamw_")
    assert (rc, out) == (1, "") and err.startswith("verify: aten::_fused_adamw_: MISS"), err
    rc, out, err = run_cli("verify", "--backend", "python", "-q", "--op", "aten::_fused_adamw_")
    assert (rc, out, err) == (0, "", "")
    rc, out, _ = run_cli("verify", "--backend", "python", "-q", "--format", "json", "--op", "aten::_fused_adamw_")
    assert rc == 0 and json.loads(out)["runs"]  # a format asked for is the result: printed


def test_lint_yaml_path_without_tags_beside_it(run_cli, tmp_path):
    (tmp_path / "ext").mkdir()
    y = tmp_path / "ext" / "native_functions.yaml"
    shutil.copy(NATIVE, y)
    rc, out, err = run_cli("lint", y)
    assert rc == 1 and " finding(s); " in out.splitlines()[-1], err
    assert "no tags.yaml beside it; using torchgen's packaged" in err
    tags = tmp_path / "t.yaml"
    shutil.copy(TAGS, tags)
    rc2, out2, err2 = run_cli("lint", "--tags", tags, y)  # --tags next to a path
    assert rc2 == rc and out2 == out and "packaged" not in err2


def test_lint_of_a_file_that_is_not_native_functions(run_cli, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# a project\n\nsome: text: here\n")
    rc, out, err = run_cli("lint", readme)
    assert rc == 2 and err == f"{readme}: error: not a native_functions.yaml: expected a .yaml file, a YAML list " \
        "of `- func:` entries (hint: lint the aten/src/ATen/native/native_functions.yaml of a checkout, or an " \
        "extension's own)\n"
    assert "tags.yaml" not in err and os.path.exists(readme)


def _tool() -> list[str]:
    """The installed command, or the module where only the source tree is on the path (a machine with no index)."""
    script = os.path.join(os.path.dirname(sys.executable), "torchgen-patch")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "torchgen_patch"]


@pytest.mark.parametrize("argv", [["lint", "-q"], ["lint", "-q", "-o", "-"], ["scan"], ["status"]])
@pytest.mark.parametrize("stdout", ["full", "closed"])
def test_standard_output_that_cannot_take_the_result_is_one_line_and_exit_3(argv, stdout):
    """Standard output on a full disk (/dev/full) or closed at start: one line, exit 3 (it was a traceback
    and exit 1, which lint's callers read as findings); a pipe closed early stays exit 0."""
    if stdout == "full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with open("/dev/full" if stdout == "full" else os.devnull, "w") as sink:
        r = subprocess.run(["sh", "-c", '"$@" >&-', "sh", *_tool(), *argv] if stdout == "closed" else [*_tool(), *argv],
                           stdout=sink if stdout == "full" else None, stderr=subprocess.PIPE, text=True)
    why = "No space left on device" if stdout == "full" else "it is closed"
    assert r.returncode == 3 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"torchgen-patch: error: cannot write to standard output: {why} (hint: "), r.stderr


def test_a_pipe_closed_early_is_still_exit_0():
    r = subprocess.run(["sh", "-c", '"$@" | head -c 1 > /dev/null; exit "${PIPESTATUS:-0}"', "sh", *_tool(), "scan"],
                       capture_output=True, text=True)
    assert "Traceback" not in r.stderr and "error" not in r.stderr, r.stderr
