"""Every flag that a subcommand's --help shows is honoured by that subcommand.

The parser is walked: each (subcommand, flag) must have a probe here, and each
probe runs the subcommand with and without the flag and checks the difference
the flag promises. Input flags are checked where they land (the Options the
pipeline resolves), the rest by what the command prints, writes or calls.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from testbed.trees import tree_from_installed
from tests.yaml_fixtures import subset_yaml
from torchgen_patch.cli.parser import parser

FUNCS = ["_cummax_helper", "_cummin_helper", "split_with_sizes_copy", "split_with_sizes_copy.out"]


def _flags(keep=lambda action: True) -> set[tuple[str, str]]:
    """(subcommand, longest spelling or dest) of every argument ``keep`` accepts."""
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    out = set()
    for cmd, p in sub.choices.items():
        for a in p._actions:
            if isinstance(a, argparse._HelpAction) or not keep(a):
                continue
            out.add((cmd, max(a.option_strings, key=len) if a.option_strings else a.dest))
    return out


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return tree_from_installed(str(tmp_path_factory.mktemp("flags") / "pytorch"), git=False)


@pytest.fixture
def subset(tmp_path):
    (tmp_path / "y").mkdir()
    return subset_yaml(str(tmp_path / "y"), FUNCS)


@pytest.fixture
def seen(monkeypatch):
    """The Options every resolve() of the run was given."""
    from torchgen_patch import pipeline

    calls = []
    real = pipeline.resolve

    def spy(opts):
        calls.append(opts)
        return real(opts)

    monkeypatch.setattr(pipeline, "resolve", spy)
    return calls


# ---------------------------------------------------------------------------
# input flags, shared by the subcommands that show them

SOURCE_ARGS = {
    "--native-functions": lambda ctx: (["--native-functions", ctx["native"]], "native_functions", ctx["native"]),
    "--tags": lambda ctx: (["--native-functions", ctx["native"], "--tags", ctx["tags"]], "tags", ctx["tags"]),
    "--pytorch-root": lambda ctx: (["--pytorch-root", ctx["tree"]], "pytorch_root", ctx["tree"]),
    "--overlay": lambda ctx: (["--overlay", ctx["overlay"]], "overlay", ctx["overlay"]),
    "--no-overlay": lambda ctx: (["--no-overlay"], "no_overlay", True),
    "--no-cache": lambda ctx: (["--no-cache"], "no_cache", True),
    "--no-requires-grad-check": lambda ctx: (["--no-requires-grad-check"], "requires_grad_check", False),
}
BASE = {  # the smallest run of each subcommand (and how to stub what would need a build)
    "scan": [], "lint": [], "gen": ["--out", "OUT"], "build": [], "install": ["--backend", "python"],
    "verify": ["--backend", "python", "--op", "aten::_cummax_helper"],
    "run": ["--backend", "python", "--op", "aten::_cummax_helper"],
    "enable": ["--backend", "python", "--op", "aten::_cummax_helper"],
}
PROGRAM = {"run": ["--", sys.executable, "-c", "pass"]}  # what goes last


@pytest.mark.parametrize("cmd,flag", sorted(f for f in _flags() if f[1] in SOURCE_ARGS and f[0] != "diff"))
def test_input_flag_reaches_the_pipeline(cmd, flag, run_cli, seen, subset, tree, tmp_path, monkeypatch):
    import torchgen_patch

    _stub_build(monkeypatch)
    _site(monkeypatch, tmp_path)
    ov = tmp_path / "o.yaml"
    ov.write_text("aten::_cummin_helper:\n  action: skip\n  reason: probe\n")
    native, tags = subset
    os.rename(tags, str(tmp_path / "tags.yaml"))  # --tags is needed to find it
    if flag != "--tags":
        os.rename(str(tmp_path / "tags.yaml"), tags)
    ctx = {"native": native, "tags": str(tmp_path / "tags.yaml"), "tree": tree, "overlay": str(ov)}
    args, field, value = SOURCE_ARGS[flag](ctx)
    base = [str(tmp_path / "out") if a == "OUT" else a for a in BASE[cmd]]
    try:
        rc, out, err = run_cli(cmd, *base, *args, *PROGRAM.get(cmd, []))
    finally:
        torchgen_patch.uninstall()
    assert rc in (0, 1), err
    assert seen and all(getattr(o, field) == value for o in seen), seen


# ---------------------------------------------------------------------------
# every other flag, one probe each


def p_scan_format(run_cli, **_):
    assert json.loads(run_cli("scan", "--format", "json")[1])["total"] > 3000
    assert run_cli("scan")[1].startswith("op ")


def p_scan_verdict(run_cli, **_):
    out = run_cli("scan", "--verdict", "unsupported")[1].splitlines()
    assert len(out) == 5 and len(run_cli("scan")[1].splitlines()) > 3000  # header, 3 rows, total


def p_against_runtime(cmd):
    def probe(run_cli, **_):
        rc, _, err = run_cli(cmd, "--against-runtime")
        assert "against runtime: 0 drift(s)" in err and "against runtime" not in run_cli(cmd)[2]
    return probe


def p_lint_paths(run_cli, subset, **_):
    rc, out, _ = run_cli("lint", subset[0])
    assert rc == 1 and out.splitlines()[-1].startswith("3 finding(s)")


def p_lint_format(run_cli, missing, **_):
    doc = json.loads(run_cli("lint", "--format", "json")[1])
    assert len(doc["findings"]) == missing
    assert run_cli("lint", "--format", "github")[1].startswith("::error ")


def p_lint_baseline(run_cli, tmp_path, missing, **_):
    b = tmp_path / "b.json"
    assert run_cli("lint", "--write-baseline", b)[0] == 0 and b.exists()
    rc, out, _ = run_cli("lint", "--baseline", b)
    assert rc == 0 and out.startswith(f"0 finding(s); {missing} accepted by the baseline {b}")


def p_lint_generated(run_cli, tmp_path, **_):
    assert run_cli("gen", "--out", tmp_path / "g")[0] == 0
    rc, out, _ = run_cli("lint", "--generated", tmp_path / "g")
    assert rc == 0 and out.startswith("0 finding(s)"), out  # every missing op has a current kernel


def p_lint_autograd(run_cli, tmp_path, **_):
    rc, out, _ = run_cli("lint", "--autograd", "--format", "json")
    rules = {f["rule"] for f in json.loads(out)["findings"]}
    assert rc == 1 and {"out-requires-grad-unchecked", "inplace-check-missing"} <= rules
    # with kernels generated (they refuse requires_grad), the out= findings are covered too
    assert run_cli("gen", "--out", tmp_path / "g")[0] == 0
    rc, out, _ = run_cli("lint", "--autograd", "--generated", tmp_path / "g", "--format", "json")
    assert {f["rule"] for f in json.loads(out)["findings"]} == {"inplace-check-missing"}


def p_lint_requires_grad(run_cli, tmp_path, **_):
    rc, out, _ = run_cli("lint", "--requires-grad", "--format", "json")
    rules = {f["rule"] for f in json.loads(out)["findings"]}
    assert rc == 1 and rules == {"missing-inplace-or-view-kernel", "out-requires-grad-unchecked"}  # no warnings
    assert run_cli("gen", "--out", tmp_path / "g")[0] == 0
    rc, out, _ = run_cli("lint", "--requires-grad", "--generated", tmp_path / "g")
    assert rc == 0 and out.startswith("0 finding(s)"), out  # the generated kernels cover both halves


def p_verify_check(run_cli, **_):
    import torchgen_patch

    try:
        rc, out, err = run_cli("verify", "--check", "requires-grad", "--both", "--backend", "python", "--op",
                               "aten::split_with_sizes_copy.out", "--format", "json")
    finally:
        torchgen_patch.uninstall()
    runs = json.loads(out)["runs"]
    assert rc == 0 and runs["without patch"]["counts"] == {"SILENT": 1}, err
    assert runs["with patch (python)"]["counts"] == {"REFUSE": 1}


def p_lint_runtime(run_cli, **_):
    rc, out, _ = run_cli("lint", "--runtime", "--namespace", "aten")
    assert out.endswith("in the live operator registry; left out by the overlay: 0\n")


def p_lint_import(run_cli, **_):
    rc, out, _ = run_cli("lint", "--runtime", "--namespace", "tgp_test", "--import", "testbed.custom_ops")
    assert rc == 1 and "tgp_test::write_one" in out


def p_lint_namespace(run_cli, **_):
    import testbed.custom_ops  # noqa: F401

    everywhere = run_cli("lint", "--runtime")[1]
    only = run_cli("lint", "--runtime", "--namespace", "aten")[1]
    assert "tgp_test::" in everywhere and "tgp_test::" not in only


def p_gen_out(run_cli, tmp_path, **_):
    for spelling in ("-o", "--output", "--out"):  # --out: the older spelling, still accepted
        assert run_cli("gen", spelling, tmp_path / spelling)[0] == 0
        assert "RegisterADInplaceOrViewPatch.cpp" in os.listdir(tmp_path / spelling)


def p_gen_shards(run_cli, tmp_path, **_):
    run_cli("gen", "--out", tmp_path / "g", "--shards", "3")
    assert sorted(n for n in os.listdir(tmp_path / "g") if n.startswith("ADInplaceOrViewPatch_")) == \
        [f"ADInplaceOrViewPatch_{i}.cpp" for i in range(3)]


def p_gen_deps(run_cli, tmp_path, **_):
    run_cli("gen", "--out", tmp_path / "g", "--output-dependencies", tmp_path / "d.cmake")
    assert "set(TORCHGEN_PATCH_SOURCES" in (tmp_path / "d.cmake").read_text()


def p_gen_dry_run(run_cli, tmp_path, **_):
    rc, _, _ = run_cli("gen", "--out", tmp_path / "g", "--output-dependencies", tmp_path / "d.cmake", "--dry-run")
    assert rc == 0 and (tmp_path / "d.cmake").exists() and not (tmp_path / "g").exists()


def p_gen_strict(run_cli, tmp_path, **_):
    assert run_cli("gen", "--out", tmp_path / "a", "--no-overlay")[0] == 0
    rc, _, err = run_cli("gen", "--out", tmp_path / "b", "--no-overlay", "--strict")
    assert rc == 2 and "cannot generate a kernel" in err


def p_build_shards(run_cli, stub_build, **_):
    run_cli("build", "--shards", "3")
    run_cli("build")
    assert [c["shards"] for c in stub_build] == [3, 2]
    assert "ADInplaceOrViewPatch_2.cpp" in stub_build[0]["files"]


def p_build_verbose(run_cli, stub_build, **_):
    run_cli("build", "--verbose")
    run_cli("build")
    assert [c["verbose"] for c in stub_build] == [True, False]


def _stub_install(monkeypatch):
    from torchgen_patch.runtime import install as inst

    calls = []

    def fake(ops=None, backend="cpp", **kw):
        calls.append((ops, backend))
        return inst.InstallReport(backend, registered=list(ops or []))

    monkeypatch.setattr(inst, "install", fake)
    return calls


def p_backend(cmd):
    def probe(run_cli, monkeypatch, **_):
        calls = _stub_install(monkeypatch)
        extra = ["--op", "aten::_cummax_helper"] if cmd == "verify" else []
        run_cli(cmd, *extra, "--backend", "python")
        run_cli(cmd, *extra)
        assert [b for _, b in calls] == ["python", "cpp"]
    return probe


def p_op(cmd):
    def probe(run_cli, monkeypatch, missing, **_):
        calls = _stub_install(monkeypatch)
        run_cli(cmd, "--op", "aten::_cummax_helper", "--op", "aten::_cummin_helper")
        run_cli(cmd)
        assert calls[0][0] == ["aten::_cummax_helper", "aten::_cummin_helper"]
        assert calls[1][0] is None or len(calls[1][0]) == missing  # install: the plan; verify: every op
    return probe


def p_install_no_build(run_cli, monkeypatch, **_):
    from torchgen_patch.runtime import install as inst

    seen = []
    monkeypatch.setattr(inst, "install", lambda ops=None, backend="cpp", **kw: seen.append(kw["build"])
                        or inst.InstallReport(backend))
    run_cli("install", "--no-build")
    run_cli("install")
    assert seen == [False, True]


def p_wheel_output_dir(run_cli, monkeypatch, tmp_path, **_):
    from torchgen_patch.runtime import prebuilt

    made = []
    _stub_build(monkeypatch)
    monkeypatch.setattr(prebuilt, "make_wheel",
                        lambda out, art, opts, log=None, saved=None: made.append(out) or saved.append(out) or
                        out + "/w.whl")
    assert run_cli("wheel", "-o", tmp_path / "w")[:2] == (0, f"{tmp_path / 'w'}/w.whl\n")
    assert run_cli("wheel")[0] == 0
    assert made == [str(tmp_path / "w"), "."]
    (tmp_path / "file").write_text("")
    rc, _, err = run_cli("wheel", "-o", tmp_path / "file" / "w")
    assert rc == 2 and err.count("\n") == 1 and "is not a directory" in err and made == [str(tmp_path / "w"), "."]


def p_wheel_quiet_verbose(run_cli, monkeypatch, tmp_path, **_):
    from torchgen_patch.runtime import prebuilt

    calls = _stub_build(monkeypatch)
    monkeypatch.setattr(prebuilt, "make_wheel", lambda out, art, opts, log=None, saved=None: out + "/w.whl")
    assert "kernels packed" in run_cli("wheel", "-o", tmp_path)[2]
    assert run_cli("wheel", "-o", tmp_path, "-q")[2] == ""
    run_cli("wheel", "-o", tmp_path, "-v")
    assert [c["verbose"] for c in calls] == [False, False, True]


V = ["verify", "--backend", "python", "--op", "aten::_cummax_helper"]


def p_verify_device(run_cli, **_):
    import torch

    rc, _, err = run_cli(*V, "--device", "cuda")
    if torch.cuda.is_available():
        assert rc == 0, err
    else:
        assert rc == 3 and "no CUDA device" in err
    assert run_cli(*V, "--device", "cpu")[0] == 0


def p_verify_without(run_cli, **_):
    out = run_cli(*V, "--without-patch")[1]
    assert "== without patch" in out and "with patch (python)" not in out


def p_verify_both(run_cli, **_):
    out = run_cli(*V, "--both")[1]
    assert "== without patch" in out and "== with patch (python)" in out


def p_verify_format(run_cli, **_):
    assert json.loads(run_cli(*V, "--format", "json")[1])
    assert run_cli(*V, "--format", "markdown")[1].startswith("#")
    text = run_cli(*V, "--format", "text")[1]
    assert "values 0->1 indices 0->1" in text  # each counter named by its argument
    assert text.startswith("== with patch") and run_cli(*V)[1] == text == run_cli(*V, "--format", "table")[1]


def p_verify_output(run_cli, tmp_path, **_):
    rc, out, _ = run_cli(*V, "-o", tmp_path / "v.txt")
    assert rc == 0 and "aten::_cummax_helper" in (tmp_path / "v.txt").read_text()
    assert out == "verify (cpu) with patch (python): PASS 1\n"  # stdout: the summary only


def p_verify_subclass(run_cli, **_):
    out = run_cli(*V, "--both", "--subclass", "wrapper")[1]
    assert out.index("== without patch, wrapper") < out.index("== with patch (python), wrapper")
    assert "MISS" in out.split("== with patch")[0] and "== without patch\n" not in out
    out = run_cli(*V, "--without-patch", "--subclass", "all")[1]
    assert [line for line in out.splitlines() if line.startswith("==")] == [
        "== without patch", "== without patch, wrapper", "== without patch, dtensor"]


def p_diff_root(run_cli, tree, **_):
    assert run_cli("diff", "--pytorch-root", tree)[1].startswith("--- a/tools/autograd/")


def p_diff_mode(run_cli, tree, **_):
    fix = run_cli("diff", "--pytorch-root", tree)[1]
    err = run_cli("diff", "--pytorch-root", tree, "--mode", "error")[1]
    assert "torchgen-patch (fix)" in fix and "torchgen-patch (error)" in err


def p_diff_output(run_cli, tree, tmp_path, **_):
    rc, out, _ = run_cli("diff", "--pytorch-root", tree, "-o", tmp_path / "x.diff")
    assert rc == 0 and out == "" and (tmp_path / "x.diff").read_text().startswith("--- a/")


def p_diff_check(run_cli, tree, **_):
    assert run_cli("diff", "--pytorch-root", tree, "--check")[:2] == (
        1, "tools/autograd/gen_inplace_or_view_type.py: not patched\n")


def p_diff_pr_body(run_cli, tree, tmp_path, monkeypatch, **_):
    from torchgen_patch.upstream import pr_body

    monkeypatch.setattr(pr_body, "measure", lambda plan, device: pr_body.Measurement("t", device, [], [], {}))
    body = tmp_path / "pr.md"
    assert run_cli("diff", "--pytorch-root", tree, "-o", tmp_path / "x.diff")[0] == 0 and not body.exists()
    assert run_cli("diff", "--pytorch-root", tree, "-o", tmp_path / "x.diff", "--pr-body", body)[0] == 0
    assert "Fixes https://github.com/pytorch/pytorch/issues/132014." in body.read_text()


def p_diff_instructions(run_cli, tree, tmp_path, monkeypatch, **_):
    import json

    from torchgen_patch.upstream import pr_body

    monkeypatch.setattr(pr_body, "measure", lambda plan, device: pr_body.Measurement("t", device, [], [], {}))
    counts = tmp_path / "c.json"
    counts.write_text(json.dumps({"torch": "t", "number": 10, "calls": [
        {"name": n, "instructions": i} for n, i in zip(pr_body.CALLGRIND_CALLS, (100, 110, 105, 90), strict=True)]}))
    body = tmp_path / "pr.md"
    assert run_cli("diff", "--pytorch-root", tree, "-o", tmp_path / "x.diff", "--pr-body", body)[0] == 0
    assert "Not measured for this description" in body.read_text()
    assert run_cli("diff", "--pytorch-root", tree, "-o", tmp_path / "x.diff", "--pr-body", body,
                   "--instructions", counts)[0] == 0
    assert "Before (no kernel): 100, After (the generated kernel): 110 (+10, +10.0%)" in body.read_text()


def p_diff_issue(run_cli, tree, tmp_path, monkeypatch, **_):
    from torchgen_patch.upstream import issue

    monkeypatch.setattr(issue, "render", lambda version, devices: f"measured on {sorted(devices)}\n")
    assert run_cli("diff", "--pytorch-root", tree, "-o", tmp_path / "x.diff")[0] == 0
    assert not (tmp_path / "i.md").exists()
    assert run_cli("diff", "--pytorch-root", tree, "-o", tmp_path / "x.diff", "--issue", tmp_path / "i.md")[0] == 0
    assert (tmp_path / "i.md").read_text() == "measured on ['cpu', 'cuda']\n"


def _run(*args):
    """`torchgen-patch run ARGS -- python -c CODE` in a process of its own (the program's output is
    the child's, which run_cli cannot capture)."""
    from tests.conftest import ROOT

    return subprocess.run([sys.executable, "-m", "torchgen_patch", "run", *map(str, args)], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True)


ACTIVE = "import torchgen_patch, torch; print(sorted(torchgen_patch.installed_ops()))"


def p_run_backend(**_):
    assert "(python)" in _run("--backend", "python", "--op", "aten::_cummax_helper", "--", sys.executable,
                              "-c", "import torch").stderr
    assert "(cpp)" in _run("--op", "aten::_cummax_helper", "--", sys.executable, "-c", "import torch").stderr


def p_run_op(**_):
    out = _run("--backend", "python", "--op", "aten::_cummax_helper", "--", sys.executable, "-c", ACTIVE).stdout
    assert out.strip() == "['aten::_cummax_helper']"


def p_run_runtime_op(**_):
    code = "import testbed.custom_ops, torchgen_patch; print(sorted(torchgen_patch.installed_ops()))"
    out = _run("--backend", "python", "--op", "aten::_cummax_helper", "--runtime-op", "tgp_test::write_one",
               "--import", "testbed.custom_ops", "--", sys.executable, "-c", code).stdout
    assert out.strip() == "['aten::_cummax_helper', 'tgp_test::write_one']"


def p_run_verbose(run_cli, monkeypatch, **_):
    from torchgen_patch.runtime.launch import launcher as launch

    seen = []
    monkeypatch.setattr(launch, "prepare", lambda *a, **k: seen.append(a[-2:]) or {})
    run_cli("run", "--verbose", "--", sys.executable, "-c", "pass")
    run_cli("run", "--", sys.executable, "-c", "pass")
    assert seen == [(True, False), (False, False)]  # (verbose, quiet)


def p_run_check_saved(**_):
    code = ("import torch; m = torch.nn.Linear(2, 2); loss = m(torch.ones(1, 2, requires_grad=True)).sum(); "
            "m.weight.data.mul_(2); loss.backward()")
    err = _run("--backend", "python", "--op", "aten::_cummax_helper", "--check-saved", "--", sys.executable, "-c",
               code).stderr
    assert "saved tensor changed without a version bump: a view of `weight` of Linear" in err, err
    assert "saved tensor changed" not in _run("--backend", "python", "--op", "aten::_cummax_helper",
                                              "--check-saved=off", "--", sys.executable, "-c", code).stderr


def p_run_program(**_):
    assert _run("--backend", "python", "--", sys.executable, "-c", "raise SystemExit(7)").returncode == 7


def p_output(cmd, *base):
    """-o FILE: the command's result goes to FILE, stdout keeps at most its summary for people (none
    with -q), stderr names the file."""
    def probe(run_cli, tmp_path, **_):
        rc, out, err = run_cli(cmd, *base, "-o", tmp_path / "r.txt")
        assert (tmp_path / "r.txt").read_text() == run_cli(cmd, *base)[1]
        assert out == "" or out.startswith(f"{cmd}"), out  # `lint: 177 findings ...`, `verify (cpu) ...`
        assert str(tmp_path / "r.txt") in err
        assert run_cli(cmd, *base, "-q", "-o", tmp_path / "q.txt")[1] == ""
    return probe


QUIET = {  # a run that says something for people (a summary on stdout, notes on stderr); -q silences it
    "scan": lambda t, _: ["-o", t / "r"], "lint": lambda t, _: ["-o", t / "r"], "gen": lambda t, _: ["-o", t / "g"],
    "verify": lambda t, _: [*V[1:], "-o", t / "r"], "diff": lambda t, tree: ["--pytorch-root", tree, "-o", t / "r"],
}


def p_quiet(cmd):
    def probe(run_cli, tmp_path, tree, **_):
        args = QUIET[cmd](tmp_path, tree)
        assert "".join(run_cli(cmd, *args)[1:]) != ""
        assert run_cli(cmd, *args, "-q")[1:] == ("", "")
    return probe


def p_inputs_verbose(cmd):
    """-v on the yaml commands: where each input came from."""
    def probe(run_cli, tmp_path, **_):
        args = ["-o", tmp_path / "g"] if cmd == "gen" else []
        assert "inputs: world=installed" in run_cli(cmd, *args, "-v")[2]
        assert "inputs:" not in run_cli(cmd, *args)[2]
    return probe


def p_build_quiet(run_cli, stub_build, **_):
    assert run_cli("build", "-q")[2] == "" and "build: " in run_cli("build")[2]


def p_install_quiet(run_cli, **_):
    args = ["install", "--backend", "python", "--op", "aten::_cummax_helper"]
    assert "registered" in run_cli(*args)[1]
    import torchgen_patch

    torchgen_patch.uninstall()
    assert run_cli(*args, "-q")[1] == ""


def p_install_verbose(run_cli, monkeypatch, **_):
    from torchgen_patch.runtime import install as inst

    seen = []
    monkeypatch.setattr(inst, "install", lambda *a, **k: seen.append(k["verbose"]) or inst.InstallReport("cpp"))
    run_cli("install", "-v")
    run_cli("install")
    assert seen == [True, False]


def p_verify_verbose(run_cli, **_):
    assert "[1/1] aten::_cummax_helper: PASS" in run_cli(*V, "-v")[2]
    assert "[1/1]" not in run_cli(*V)[2]


def p_run_quiet(**_):
    args = ["--backend", "python", "--op", "aten::_cummax_helper", "--", sys.executable, "-c", "import torch"]
    assert "torchgen-patch: 1 kernel active (python)" in _run(*args).stderr
    assert _run("-q", *args).stderr == ""


def _site(monkeypatch, tmp_path) -> str:
    """enable, disable and status act on a site-packages of the test's own, never this environment's."""
    from torchgen_patch.runtime.launch import enable as en

    site = tmp_path / "site-packages"
    site.mkdir(exist_ok=True)
    monkeypatch.setattr(en, "site_dir", lambda: str(site))
    return str(site)


def _enabled_spec(site: str) -> dict:
    """The launch spec an enabled environment's data file holds, as its JSON says it."""
    from torchgen_patch.runtime.launch import enable as en

    return json.loads(en.state(site).spec.to_json())


def p_enable(field, args, value, default):
    def probe(run_cli, monkeypatch, tmp_path, **_):
        site = _site(monkeypatch, tmp_path)
        _stub_build(monkeypatch)
        assert run_cli("enable", "--backend", "python")[0] == 0 and _enabled_spec(site)[field] == default
        assert run_cli("enable", "--backend", "python", *args)[0] == 0 and _enabled_spec(site)[field] == value
    return probe


def p_enable_verbose(run_cli, monkeypatch, tmp_path, **_):
    _site(monkeypatch, tmp_path)
    calls = _stub_build(monkeypatch)
    run_cli("enable", "-v")
    run_cli("enable")
    # the builds enable makes (the kernels, the check's native hooks) say their compiler's commands
    assert [c["verbose"] for c in calls] == [True, True, False, False]


def p_disable_quiet_verbose(run_cli, monkeypatch, tmp_path, **_):
    _site(monkeypatch, tmp_path)
    _stub_build(monkeypatch)
    assert run_cli("disable")[2].startswith("disable: not enabled (") and run_cli("disable", "-q")[1:] == ("", "")
    run_cli("enable", "--backend", "python")
    rc, out, err = run_cli("disable", "-v")
    assert rc == 0 and out.startswith("disabled: removed ") and err.startswith("disable: it was ") and \
        "(torchgen-patch 0.1.0; python, every op of the plan" in err


def p_status_quiet_verbose(run_cli, monkeypatch, tmp_path, **_):
    _site(monkeypatch, tmp_path)
    _stub_build(monkeypatch)
    assert run_cli("status", "-q") == (1, "", "") and run_cli("status")[1].startswith("not enabled: ")
    run_cli("enable", "--backend", "python")
    assert run_cli("status", "-q") == (0, "", "")
    assert "its launch spec: {" in run_cli("status", "-v")[2] and run_cli("status")[2] == ""


def p_diff_verbose(run_cli, tree, **_):
    assert "not patched; writing mode fix" in run_cli("diff", "--pytorch-root", tree, "-v")[2]
    assert run_cli("diff", "--pytorch-root", tree)[2] == ""


def _fleet_folder(tmp_path):
    """A folder of findings two processes wrote (tests/regen_goldens.py's, less its line cut short)."""
    from tests.regen_goldens import fleet_records

    d = tmp_path / "fleet"
    d.mkdir(exist_ok=True)
    for name, data in fleet_records().items():
        (d / name).write_bytes(data[:data.rindex(b"\n") + 1])
    return d


def p_findings_folder(run_cli, tmp_path, **_):
    rc, out, err = run_cli("findings", _fleet_folder(tmp_path))
    assert (rc, err) == (1, "") and out.startswith("torchgen-patch findings: 5 sites, 15 findings")
    (tmp_path / "none").mkdir()
    assert run_cli("findings", tmp_path / "none")[0] == 0


def p_findings_format(run_cli, tmp_path, **_):
    d = _fleet_folder(tmp_path)
    assert json.loads(run_cli("findings", d, "--format", "json")[1])["findings"] == 15
    assert run_cli("findings", d, "--format", "markdown")[1].startswith("# Saved tensors written behind")


def p_findings_output_quiet(run_cli, tmp_path, **_):
    d = _fleet_folder(tmp_path)
    rc, out, err = run_cli("findings", d, "-o", tmp_path / "r.txt")
    assert (rc, out) == (1, "") and str(tmp_path / "r.txt") in err
    assert (tmp_path / "r.txt").read_text() == run_cli("findings", d)[1]
    assert run_cli("findings", d, "-q", "-o", tmp_path / "q.txt")[1:] == ("", "")


def p_findings_verbose(run_cli, tmp_path, **_):
    d = _fleet_folder(tmp_path)
    err = run_cli("findings", d, "-v")[2]
    assert f"findings: {d}/findings-node-b-202.jsonl: 4 findings\n" in err and run_cli("findings", d)[2] == ""


def p_run_check_every(**_):
    """--check-every 1: every step, the first included (the default, 1 in 32, never draws a program's first)."""
    code = ("import torch; m = torch.nn.Linear(2, 2); loss = m(torch.ones(1, 2, requires_grad=True)).sum(); "
            "m.weight.data.mul_(2); loss.backward()")
    args = ["--backend", "python", "--op", "aten::_cummax_helper"]
    err = _run(*args, "--check-every", "1", "--", sys.executable, "-c", code).stderr
    assert "saved-tensor check on (warn, every step)" in err and "saved tensor changed without a version" in err, err
    err = _run(*args, "--", sys.executable, "-c", code).stderr
    assert "saved-tensor check on (warn, 1 step in 32)" in err and "saved tensor changed" not in err, err


def p_run_findings(tmp_path, **_):
    code = ("import torch; m = torch.nn.Linear(2, 2); loss = m(torch.ones(1, 2, requires_grad=True)).sum(); "
            "m.weight.data.mul_(2); loss.backward()")
    r = _run("--backend", "python", "--op", "aten::_cummax_helper", "--check-saved", "--findings", tmp_path / "f",
             "--", sys.executable, "-c", code)
    assert "saved tensor changed without a version bump" in r.stderr, r.stderr
    (name,) = os.listdir(tmp_path / "f")
    assert json.loads((tmp_path / "f" / name).read_text())["node"] == "AddmmBackward0"


def p_enable_findings(run_cli, monkeypatch, tmp_path, **_):
    site = _site(monkeypatch, tmp_path)
    _stub_build(monkeypatch)
    assert run_cli("enable", "--backend", "python")[0] == 0 and "findings" not in _enabled_spec(site)
    assert run_cli("enable", "--backend", "python", "--findings", tmp_path / "f")[0] == 0
    spec = _enabled_spec(site)
    assert (spec["findings"], spec["check_saved"]) == (str(tmp_path / "f"), "warn")
    assert f"saved-tensor check: warn, 1 step in 32, findings to {tmp_path / 'f'};" in run_cli("status")[1]


PROBES = {
    ("scan", "--output"): p_output("scan"), ("lint", "--output"): p_output("lint"),
    ("scan", "--quiet"): p_quiet("scan"), ("lint", "--quiet"): p_quiet("lint"), ("gen", "--quiet"): p_quiet("gen"),
    ("verify", "--quiet"): p_quiet("verify"), ("diff", "--quiet"): p_quiet("diff"),
    ("build", "--quiet"): p_build_quiet, ("install", "--quiet"): p_install_quiet, ("run", "--quiet"): p_run_quiet,
    ("scan", "--verbose"): p_inputs_verbose("scan"), ("lint", "--verbose"): p_inputs_verbose("lint"),
    ("gen", "--verbose"): p_inputs_verbose("gen"), ("install", "--verbose"): p_install_verbose,
    ("verify", "--verbose"): p_verify_verbose, ("diff", "--verbose"): p_diff_verbose,
    ("scan", "--format"): p_scan_format, ("scan", "--verdict"): p_scan_verdict,
    ("scan", "--against-runtime"): p_against_runtime("scan"),
    ("lint", "paths"): p_lint_paths, ("lint", "--format"): p_lint_format,
    ("lint", "--against-runtime"): p_against_runtime("lint"),
    ("lint", "--baseline"): p_lint_baseline, ("lint", "--write-baseline"): p_lint_baseline,
    ("lint", "--generated"): p_lint_generated, ("lint", "--runtime"): p_lint_runtime,
    ("lint", "--autograd"): p_lint_autograd, ("lint", "--requires-grad"): p_lint_requires_grad,
    ("lint", "--import"): p_lint_import, ("lint", "--namespace"): p_lint_namespace,
    ("gen", "--output"): p_gen_out, ("gen", "--shards"): p_gen_shards, ("gen", "--output-dependencies"): p_gen_deps,
    ("gen", "--dry-run"): p_gen_dry_run, ("gen", "--strict"): p_gen_strict,
    ("build", "--shards"): p_build_shards, ("build", "--verbose"): p_build_verbose,
    ("install", "--backend"): p_backend("install"), ("install", "--op"): p_op("install"),
    ("install", "--no-build"): p_install_no_build, ("wheel", "--output"): p_wheel_output_dir,
    ("wheel", "--quiet"): p_wheel_quiet_verbose, ("wheel", "--verbose"): p_wheel_quiet_verbose,
    ("verify", "--backend"): p_backend("verify"), ("verify", "--op"): p_op("verify"),
    ("verify", "--device"): p_verify_device, ("verify", "--without-patch"): p_verify_without,
    ("verify", "--both"): p_verify_both, ("verify", "--format"): p_verify_format,
    ("verify", "--output"): p_verify_output, ("verify", "--subclass"): p_verify_subclass,
    ("verify", "--check"): p_verify_check,
    ("run", "--backend"): p_run_backend, ("run", "--op"): p_run_op, ("run", "--runtime-op"): p_run_runtime_op,
    ("run", "--import"): p_run_runtime_op, ("run", "--verbose"): p_run_verbose, ("run", "program"): p_run_program,
    ("run", "--check-saved"): p_run_check_saved, ("run", "--findings"): p_run_findings,
    ("enable", "--findings"): p_enable_findings,
    ("findings", "folder"): p_findings_folder, ("findings", "--format"): p_findings_format,
    ("findings", "--output"): p_findings_output_quiet, ("findings", "--quiet"): p_findings_output_quiet,
    ("findings", "--verbose"): p_findings_verbose,
    ("enable", "--backend"): p_enable("backend", ["--backend", "cpp"], "cpp", "python"),
    ("enable", "--op"): p_enable("ops", ["--op", "_cummax_helper"], ["aten::_cummax_helper"], None),
    ("enable", "--quiet"): p_enable("quiet", ["-q"], True, False), ("enable", "--verbose"): p_enable_verbose,
    ("enable", "--strict"): p_enable("strict", ["--strict"], True, False),
    ("enable", "--check-saved"): p_enable("check_saved", ["--check-saved=raise"], "raise", "warn"),
    ("enable", "--check-every"): p_enable("check_every", ["--check-every", "8"], 8, 32),
    ("run", "--check-every"): p_run_check_every,
    ("disable", "--quiet"): p_disable_quiet_verbose, ("disable", "--verbose"): p_disable_quiet_verbose,
    ("status", "--quiet"): p_status_quiet_verbose, ("status", "--verbose"): p_status_quiet_verbose,
    ("diff", "--pytorch-root"): p_diff_root, ("diff", "--mode"): p_diff_mode, ("diff", "--output"): p_diff_output,
    ("diff", "--check"): p_diff_check, ("diff", "--pr-body"): p_diff_pr_body,
    ("diff", "--instructions"): p_diff_instructions, ("diff", "--issue"): p_diff_issue,
}


def test_every_option_has_help_and_one_grammar():
    """Every option says what it does; where a command writes a result it is -o/--output; -q/-v everywhere."""
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    for cmd, p in sub.choices.items():
        opts = {o for a in p._actions for o in a.option_strings}
        assert {"-q", "--quiet", "-v", "--verbose"} <= opts, cmd
        if cmd not in ("build", "install", "run", "enable", "disable", "status"):  # those that write a result somewhere
            assert {"-o", "--output"} <= opts, cmd
        for a in p._actions:
            assert a.help and a.help != argparse.SUPPRESS, (cmd, a.option_strings or a.dest)
        if any("--format" in a.option_strings for a in p._actions):
            fmt = next(a for a in p._actions if "--format" in a.option_strings)
            assert fmt.choices[0] == "text" and "json" in fmt.choices, cmd  # the same names everywhere


def test_every_flag_has_a_probe():
    shown = {f for f in _flags() if f[1] not in SOURCE_ARGS or f[0] == "diff"}
    assert shown == set(PROBES)


@pytest.mark.parametrize("cmd,flag", sorted(PROBES))
def test_flag_is_honoured(cmd, flag, run_cli, monkeypatch, subset, tree, tmp_path, default_scan):
    import torchgen_patch

    try:
        PROBES[(cmd, flag)](run_cli=run_cli, monkeypatch=monkeypatch, subset=subset, tree=tree, tmp_path=tmp_path,
                            missing=len(default_scan.by_verdict("missing")),
                            stub_build=_stub_build(monkeypatch) if cmd == "build" else None)
    finally:
        torchgen_patch.uninstall()


def _stub_build(monkeypatch):
    from torchgen_patch import runtime
    from torchgen_patch.runtime import checklib
    from torchgen_patch.runtime import compile as b
    from torchgen_patch.runtime.compile.record import Manifest

    calls = []

    def fake(files, ops, shards, verbose=False, **kw):
        calls.append({"files": sorted(files), "ops": list(ops), "shards": shards, "verbose": verbose})
        return b.Library("/x.so", "/", tuple(ops), False)

    def fake_artifact(path, origin="given", manifest=True):  # the composer's checks of the (fake) build it got
        ops = calls[-1]["ops"] if calls else []
        manifest = Manifest(tuple((op, "") for op in ops), "{}")
        return runtime.Artifact(path, "0" * 64, "t", manifest, origin, "/")

    monkeypatch.setattr(b, "build", fake)
    monkeypatch.setattr(runtime, "artifact_at", fake_artifact)
    monkeypatch.setattr(runtime, "_indexed", lambda index: None)  # every call reaches the (fake) build
    # the saved-tensor check's native hooks, which the wheel packs beside the kernels: a list the fake
    # make_wheel appends to (so a wheel made without them fails the probe)
    monkeypatch.setattr(checklib, "saved_build", lambda verbose=False, log=None: [])
    return calls


def test_progress_on_a_terminal_only_never_in_ci_or_quiet(monkeypatch, capsys):
    """Long steps show one line rewritten in place on a terminal; in CI, into a pipe or with -q, nothing."""
    from torchgen_patch.checks.verify import OpResult
    from torchgen_patch.cli import commands

    people, quiet = argparse.Namespace(quiet=False, verbose=False), argparse.Namespace(quiet=True, verbose=False)
    r = OpResult("aten::_foreach_zero_", "cpu", True, "PASS")
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    show = commands._progress(people, "verify")
    show(1, 2, r)
    show(2, 2, r)
    err = capsys.readouterr().err
    assert "\rverify: 1/2 aten::_foreach_zero_" in err.replace("\033[K", "") and "\n" not in err
    assert commands._progress(quiet, "verify") is None
    monkeypatch.setenv("CI", "true")
    assert commands._progress(people, "verify") is None
    monkeypatch.delenv("CI")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert commands._progress(people, "verify") is None
