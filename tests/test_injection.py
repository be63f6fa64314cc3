"""Text from input cannot break out of what it is written into: a yaml or overlay file name with a
newline, `*/`, quotes or `%0A` stays inside its C++ comment, its text line, its JSON string, its
SARIF URI and its GitHub annotation; an output directory stays one CMake path; operator and
argument names with such characters never reach C++. torchgen's schema parser does NOT refuse
them (``ev"il(Tensor(a!) self) -> ()`` parses), so this tool checks them itself."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from urllib.parse import unquote

import pytest

from tests.yaml_fixtures import subset_yaml
from torchgen_patch.codegen import output_names
from torchgen_patch.errors import printable

# a file name that would end a C++ line comment, close a block comment, end a string, fake a
# URL-encoded newline, split GitHub properties, and reverse the text after it
HOSTILE = 'in\n#error injected */nf\n#error injected "q" %0A ,: \u2028 \u202e x.yaml'
FUNCS = ["_cummax_helper", "split_with_sizes_copy", "split_with_sizes_copy.out"]


@pytest.fixture
def hostile_yaml(tmp_path, monkeypatch):
    native, tags = subset_yaml(str(tmp_path), FUNCS)
    path = tmp_path / HOSTILE
    path.parent.mkdir()
    os.rename(native, path)
    monkeypatch.chdir(tmp_path)  # reports name it relative to here, as CI does
    return HOSTILE, tags


def test_generated_cpp_keeps_the_name_in_its_comment(run_cli, hostile_yaml, tmp_path):
    native, tags = hostile_yaml
    rc, out, err = run_cli("gen", "--native-functions", native, "--tags", tags, "--no-overlay", "--out", "gen")
    assert rc == 0, err
    escaped = printable(os.path.basename(HOSTILE))  # only the file's name reaches generated files
    assert "\n" not in escaped and "\u2028" not in escaped and "\u202e" not in escaped
    kernel_lines = []
    for name in sorted(os.listdir(tmp_path / "gen")):
        if not name.endswith((".cpp", ".h")):
            continue
        text = (tmp_path / "gen" / name).read_text(encoding="utf-8")
        for line in text.splitlines():
            if "injected" in line:
                assert line.startswith("// "), line
                kernel_lines.append(line)
            assert not line.rstrip().endswith("\\"), line  # no line continuation out of a comment
        assert not any(line.lstrip().startswith("#error") for line in text.splitlines())
        # what the compiler sees once comments are gone: nothing of the name is left
        cxx = shutil.which(os.environ.get("CXX", "c++"))
        if cxx:
            pre = subprocess.run([cxx, "-E", "-fpreprocessed", "-x", "c++", str(tmp_path / "gen" / name)],
                                 capture_output=True, text=True)
            assert pre.returncode == 0, pre.stderr
            assert "injected" not in pre.stdout and "%0A" not in pre.stdout
    assert kernel_lines and all(line.endswith(f"({escaped}:{line.rsplit(':', 1)[1]}") for line in kernel_lines)
    manifest = json.loads((tmp_path / "gen" / "torchgen_patch_manifest.json").read_text())
    assert all(k["yaml"].startswith(escaped + ":") for k in manifest["kernels"])


def _github_unescape(s: str) -> str:
    for a, b in (("%2C", ","), ("%3A", ":"), ("%0A", "\n"), ("%0D", "\r"), ("%25", "%")):
        s = s.replace(a, b)
    return s


def test_every_report_format_round_trips_the_name(run_cli, hostile_yaml):
    native, tags = hostile_yaml
    base = ["lint", "--native-functions", native, "--tags", tags, "--no-overlay"]
    rc, out, _ = run_cli(*base, "--format", "json")
    assert rc == 1
    doc = json.loads(out)
    n = len(doc["findings"])
    assert n == 2 and all(f["path"] == HOSTILE for f in doc["findings"])

    rc, out, _ = run_cli(*base, "--format", "text")
    lines = out.splitlines()
    assert len(lines) == n + 1 and all(line.startswith(printable(HOSTILE) + ":") for line in lines[:n])

    rc, out, _ = run_cli(*base, "--format", "lintrunner")
    msgs = [json.loads(line) for line in out.splitlines()]
    assert len(msgs) == n and all(m["path"] == HOSTILE for m in msgs)

    rc, out, _ = run_cli(*base, "--format", "sarif")
    results = json.loads(out)["runs"][0]["results"]
    uris = [r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in results]
    assert len(uris) == n
    for uri in uris:
        assert re.fullmatch(r"[A-Za-z0-9\-._~%/]+", uri), uri  # RFC 3986: nothing raw
        assert unquote(uri) == HOSTILE

    rc, out, _ = run_cli(*base, "--format", "github")
    lines = out.rstrip("\n").split("\n")  # the runner reads commands line by line (LF; U+2028 is no line end)
    assert len(lines) == n and all(line.startswith("::error ") for line in lines)
    for line in lines:
        props = line[len("::error "):].split("::", 1)[0]
        fields = dict(p.split("=", 1) for p in props.split(","))
        assert set(fields) == {"file", "line", "title"}
        assert _github_unescape(fields["file"]) == HOSTILE


def test_an_overlay_name_stays_on_its_error_line(run_cli, hostile_yaml, tmp_path):
    native, tags = hostile_yaml
    overlay = tmp_path / os.path.dirname(HOSTILE) / ("ov\n" + os.path.basename(HOSTILE))
    overlay.write_text("aten::no_such_op:\n  action: skip\n  reason: r\n")
    rel = os.path.relpath(overlay, tmp_path)
    rc, out, err = run_cli("lint", "--native-functions", native, "--tags", tags, "--overlay", rel)
    assert rc == 2 and out == ""
    assert err.splitlines() == [f"{printable(rel)}:1: error: unknown operator 'aten::no_such_op'"]


@pytest.mark.parametrize("func", [
    'evil"op(Tensor(a!) self) -> ()',
    "evil*/op(Tensor(a!) self) -> ()",
    "evil\nop(Tensor(a!) self) -> ()",
    "evil%0Aop(Tensor(a!) self) -> ()",
    'tp_ok.ov"l(Tensor(a!) self) -> ()',
    "tp_ok.ov*/l(Tensor(a!) self) -> ()",
    "tp_ok(Tensor self, Tensor(a!) values, Tensor x\"y) -> ()",
    "tp_ok(Tensor self, Tensor(a!) values, Tensor x/*y) -> ()",
    "tp_ok(Tensor self, Tensor(a!) v\"alues) -> ()",
])
def test_names_that_are_not_identifiers_never_reach_cpp(run_cli, tmp_path, func):
    """torchgen's schema parser accepts every one of them: this tool refuses them itself."""
    from torchgen.model import FunctionSchema

    FunctionSchema.parse(func)  # no error: torchgen does not validate names
    native, tags = subset_yaml(str(tmp_path), FUNCS[:1])
    with open(native, "a", encoding="utf-8") as fh:
        fh.write(f"\n- func: {json.dumps(func)}\n")
    rc, out, err = run_cli("gen", "--native-functions", native, "--tags", tags, "--no-overlay",
                           "--out", str(tmp_path / "gen"))
    assert rc == 2 and len(err.splitlines()) == 1 and ": error: " in err, err
    assert "identifier" in err, err
    assert not (tmp_path / "gen").exists()


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_cmake_fragment_round_trips_every_path(run_cli, tmp_path):
    native, tags = subset_yaml(str(tmp_path), FUNCS)
    out = str(tmp_path / 'a "b" $c ${d} \\e @f@ g')
    deps = tmp_path / "deps.cmake"
    rc, _, err = run_cli("gen", "--native-functions", native, "--tags", tags, "--no-overlay", "--out", out,
                         "--output-dependencies", deps, "--dry-run")
    assert rc == 0, err
    script = tmp_path / "print.cmake"
    script.write_text(f'include("{deps}")\nforeach(f IN LISTS TORCHGEN_PATCH_OUTPUTS)\n  message("${{f}}")\n'
                      "endforeach()\n")
    r = subprocess.run(["cmake", "-P", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [f"{out}/{n}" for n in sorted(output_names(2))]  # 2: gen's default shards


@pytest.mark.parametrize("bad", ["a;b", "a\nb"])
def test_cmake_fragment_refuses_what_a_cmake_list_cannot_hold(run_cli, tmp_path, bad):
    native, tags = subset_yaml(str(tmp_path), FUNCS)
    deps = tmp_path / "deps.cmake"
    rc, _, err = run_cli("gen", "--native-functions", native, "--tags", tags, "--no-overlay",
                         "--out", str(tmp_path / bad), "--output-dependencies", deps, "--dry-run")
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"the output directory's name has {ascii(bad[1])}, which a CMake list of paths cannot hold" in err
    assert not deps.exists()
