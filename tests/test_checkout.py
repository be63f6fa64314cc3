"""The checkout world: a PyTorch source checkout (its own torchgen, tools/autograd
and yaml) as the input, with no torch installed, next to the installed world.

Trees are assembled from torch wheels (testbed/trees.py): torch 2.13 (installed
here) and torch 2.14.1 (from the local package cache; its files only, nothing
of it imported from site-packages)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from testbed.notorch_venv import make_venv
from testbed.trees import find_torch_wheel, site_from_wheel, tree_from_installed, tree_from_wheel
from testbed.upstream_tree import registrations, run_codegen

WHEEL_2141 = find_torch_wheel("2.14.1")
needs_2141 = pytest.mark.skipif(WHEEL_2141 is None, reason="the torch 2.14.1 wheel is not in the local package cache")
YAML = "aten/src/ATen/native/native_functions.yaml"


@pytest.fixture(scope="session")
def notorch():
    """A venv with the project's own dependencies and lintrunner, and no torch. On a machine
    with no package index (the GPU machine) these tests are skipped, by name, only when
    TORCHGEN_PATCH_NO_VENV=1 says so; anywhere else a failure to build the venv fails them."""
    if os.environ.get("TORCHGEN_PATCH_NO_VENV") == "1":
        pytest.skip("TORCHGEN_PATCH_NO_VENV=1: no package index here to build a venv without torch")
    return make_venv(os.path.join(ROOT, ".cache", "notorch-venv"), ["lintrunner"])


@pytest.fixture(scope="session")
def tree213(tmp_path_factory):
    return tree_from_installed(str(tmp_path_factory.mktemp("t213") / "pytorch"))


@pytest.fixture(scope="session")
def tree2141(tmp_path_factory):
    if WHEEL_2141 is None:
        pytest.skip("the torch 2.14.1 wheel is not in the local package cache")
    return tree_from_wheel(WHEEL_2141, str(tmp_path_factory.mktemp("t2141") / "pytorch"))


def tgp(python, *args, cwd=ROOT, pythonpath=ROOT, cache=None):
    """torchgen-patch in a fresh process of ``python``."""
    env = dict(os.environ, PYTHONPATH=pythonpath)
    if cache is not None:
        env["TORCHGEN_PATCH_CACHE"] = str(cache)
    return subprocess.run([python, "-m", "torchgen_patch", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True)


def _json(r):
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def _files(d):
    out = {}
    for name in sorted(os.listdir(d)):
        data = open(os.path.join(d, name), "rb").read()
        if name == "torchgen_patch_manifest.json":  # it names the torch release: compare the rest
            doc = json.loads(data)
            doc.pop("torch")
            data = json.dumps(doc, sort_keys=True).encode()
        out[name] = data
    return out


def _compare_worlds(notorch, tree, ref_python, ref_pythonpath, tmp_path, expected_total, expected_missing):
    """scan, lint and gen --strict on ``tree`` (checkout world, no torch) against the
    same release's installed world (its packaged torchgen and autograd codegen)."""
    ref_scan = _json(tgp(ref_python, "scan", "--format", "json", "--no-cache", pythonpath=ref_pythonpath))
    scan = _json(tgp(notorch, "scan", "--format", "json", "--pytorch-root", tree, cache=tmp_path / "c"))
    assert scan["total"] == ref_scan["total"] == expected_total
    assert scan["counts"] == ref_scan["counts"] and scan["counts"]["missing"] == expected_missing
    src = scan["sources"]  # every input said explicitly, with what it is
    assert (src["world"], src["torchgen"], src["autograd_codegen"]) == (
        "checkout", os.path.join(tree, "torchgen"), os.path.join(tree, "tools", "autograd"))
    assert src["native_functions_sha256"] == ref_scan["sources"]["native_functions_sha256"]
    assert ref_scan["sources"]["world"] == "installed"
    # lint: the same ops, at the tree's own yaml lines
    ref = _json(tgp(ref_python, "lint", "--format", "json", pythonpath=ref_pythonpath, cache=tmp_path / "c"))
    got = _json(tgp(notorch, "lint", "--format", "json", "--pytorch-root", tree, cache=tmp_path / "c"))
    assert {(f["op"], f["line"]) for f in got["findings"]} == {(f["op"], f["line"]) for f in ref["findings"]}
    assert len(got["findings"]) == expected_missing
    assert {f["path"] for f in got["findings"]} == {os.path.join(tree, YAML)}
    tree_lines = open(os.path.join(tree, YAML), encoding="utf-8").read().splitlines()
    f = next(f for f in got["findings"] if f["op"] == "aten::split_with_sizes_copy.out")
    assert tree_lines[f["line"] - 1].startswith("- func: split_with_sizes_copy.out(")
    # gen --strict: the same files
    r = tgp(ref_python, "gen", "--strict", "--out", tmp_path / "ref", pythonpath=ref_pythonpath)
    assert r.returncode == 0, r.stderr
    r = tgp(notorch, "gen", "--strict", "--pytorch-root", tree, "--out", tmp_path / "co")
    assert r.returncode == 0, r.stderr
    assert _files(tmp_path / "co") == _files(tmp_path / "ref")


def test_checkout_of_the_installed_release_without_torch(notorch, tree213, tmp_path, default_scan):
    _compare_worlds(notorch, tree213, sys.executable, ROOT, tmp_path, default_scan.total(),
                    len(default_scan.by_verdict("missing")))


@needs_2141
def test_checkout_of_a_newer_release_without_torch(notorch, tree2141, tmp_path):
    site = site_from_wheel(WHEEL_2141, str(tmp_path / "site"))
    _compare_worlds(notorch, tree2141, sys.executable, os.pathsep.join([site, ROOT]), tmp_path, 3103, 177)


@pytest.mark.parametrize("release", ["installed", pytest.param("2.14.1", marks=needs_2141)])
def test_diff_fix_adds_exactly_the_missing_kernels(notorch, tmp_path, release):
    """diff --mode fix applies to the tree, and the tree's own codegen, run from the tree
    with no torch, then registers exactly the ops lint reported (no more, no fewer)."""
    tree = (tree_from_installed(str(tmp_path / "pytorch")) if release == "installed"
            else tree_from_wheel(WHEEL_2141, str(tmp_path / "pytorch")))
    doc = _json(tgp(notorch, "lint", "--format", "json", "--pytorch-root", tree))
    missing = {f["op"] for f in doc["findings"]}
    covered = doc["counts"]["covered"] + len(missing)
    before = run_codegen(tree, str(tmp_path / "out0"), python=notorch)
    assert before.returncode == 0, before.stderr
    r = tgp(notorch, "diff", "--pytorch-root", tree, "-o", tmp_path / "fix.diff")
    assert r.returncode == 0, r.stderr
    subprocess.run(["git", "apply", str(tmp_path / "fix.diff")], cwd=tree, check=True)
    after = run_codegen(tree, str(tmp_path / "out1"), python=notorch)
    assert after.returncode == 0, after.stderr
    old, new = registrations(str(tmp_path / "out0")), registrations(str(tmp_path / "out1"))
    assert set(old) <= set(new)
    assert {f"aten::{n}" for n in set(new) - set(old)} == missing
    # and the patched checkout lints clean: its codegen now covers every one of them
    r = tgp(notorch, "lint", "--pytorch-root", tree)
    assert r.returncode == 0 and r.stdout.startswith(f"0 finding(s); covered {covered}, missing 0"), r.stdout + r.stderr


@needs_2141
def test_two_worlds_in_one_process_never_mix(tree2141, default_scan):
    """The installed torchgen (imported by torch here) stays what it was while a
    newer checkout's torchgen does its work in the same process, and vice versa."""
    import torch  # noqa: F401  (torch imports the installed torchgen)
    import torchgen

    from torchgen_patch.scan import scan
    from torchgen_patch.sources import Options, resolve

    before = {n: m for n, m in sys.modules.items() if n == "torchgen" or n.startswith("torchgen.")}
    co = scan(resolve(Options(pytorch_root=tree2141)), use_cache=False)
    assert co.total() == 3103 and co.sources.world == "checkout"
    assert co.get("aten::split_with_sizes_copy.out").loc.path == os.path.join(tree2141, YAML)
    after = {n: m for n, m in sys.modules.items() if n == "torchgen" or n.startswith("torchgen.")}
    assert after == before and sys.modules["torchgen"] is torchgen
    assert not any(n == "tools" or n.startswith("tools.") for n in sys.modules)
    again = scan(resolve(Options()), use_cache=False)
    assert again.records == default_scan.records


def test_cache_never_answers_for_another_world_or_toolchain(tmp_path, monkeypatch, run_cli, default_scan):
    """One yaml, three toolchains: the installed one, a checkout's, and that checkout
    after its autograd codegen is patched. Each gets its own answer, cache or not."""
    monkeypatch.setenv("TORCHGEN_PATCH_CACHE", str(tmp_path / "cache"))
    tree = tree_from_installed(str(tmp_path / "pytorch"))
    native = os.path.join(tree, YAML)
    assert run_cli("lint", "--pytorch-root", tree)[0] == 1
    assert run_cli("lint", "--native-functions", native)[0] == 1  # installed world, same bytes
    assert len(set(os.listdir(tmp_path / "cache")) - {"entries.key"}) == 4  # a scan and an overlay entry per world
    rc, diff_text, err = run_cli("diff", "--pytorch-root", tree)
    assert rc == 0, err
    (tmp_path / "fix.diff").write_text(diff_text)
    subprocess.run(["git", "apply", str(tmp_path / "fix.diff")], cwd=tree, check=True)
    missing, covered = len(default_scan.by_verdict("missing")), default_scan.counts()["covered"]
    rc, out, _ = run_cli("lint", "--pytorch-root", tree)  # the patched codegen covers them all
    assert rc == 0 and out.startswith(f"0 finding(s); covered {covered + missing}, missing 0"), out
    rc, out, _ = run_cli("lint", "--native-functions", native)  # the installed codegen still does not
    assert rc == 1 and out.splitlines()[-1].startswith(f"{missing} finding(s)"), out
    # a one-byte change in the checkout's torchgen is another toolchain too
    model = os.path.join(tree, "torchgen", "model.py")
    open(model, "a").write("# edited\n")
    n = len([p for p in os.listdir(tmp_path / "cache") if p.startswith("scan-")])
    assert run_cli("lint", "--pytorch-root", tree)[0] == 0
    assert len([p for p in os.listdir(tmp_path / "cache") if p.startswith("scan-")]) == n + 1


# ---------------------------------------------------------------------------
# bad checkouts


def _break(tree, case):
    if case == "no_torchgen":
        shutil.rmtree(os.path.join(tree, "torchgen"))
    elif case == "no_autograd":
        shutil.rmtree(os.path.join(tree, "tools", "autograd"))
    elif case == "syntax_error":
        open(os.path.join(tree, "torchgen", "model.py"), "a").write("\ndef broken(:\n")
    elif case == "missing_dependency":
        p = os.path.join(tree, "torchgen", "__init__.py")
        open(p, "w").write("import no_such_dependency_xyz\n" + open(p).read())
    elif case == "rejected_yaml":
        p = os.path.join(tree, YAML)
        open(p, "a").write("\n- func: foo(Tensor self -> Tensor\n")
    elif case == "half_checked_out":
        os.unlink(os.path.join(tree, "aten/src/ATen/native/tags.yaml"))
    elif case == "codegen_of_another_shape":
        p = os.path.join(tree, "tools", "autograd", "gen_inplace_or_view_type.py")
        open(p, "w").write(open(p).read().replace("def get_view_info(", "def get_view_info_v2("))


@pytest.mark.parametrize("case,expected", [
    ("no_torchgen", "T: error: not a PyTorch checkout: torchgen/__init__.py is missing (hint: --pytorch-root needs "
                    "the checkout's own torchgen/; is the checkout complete?)"),
    ("no_autograd", "T: error: not a PyTorch checkout: tools/autograd/gen_inplace_or_view_type.py is missing "
                    "(hint: --pytorch-root needs the checkout's own tools/autograd/; is the checkout complete?)"),
    ("syntax_error", "T/torchgen/model.py:LINE: error: cannot import torchgen.gen: invalid syntax (hint: the "
                     "checkout's torchgen and tools/autograd need pyyaml and typing_extensions; is the checkout "
                     "intact?)"),
    ("missing_dependency", "T/torchgen/__init__.py:LINE: error: cannot import torchgen.gen: No module named "
                           "'no_such_dependency_xyz' (hint: the checkout's torchgen and tools/autograd need pyyaml "
                           "and typing_extensions; is the checkout intact?)"),
    ("rejected_yaml", f"T/{YAML}:LINE: error: the checkout's torchgen rejected this file: Invalid function schema: "
                      "foo(Tensor self -> Tensor (hint: is the yaml from a torch release this torchgen can read?)"),
    ("half_checked_out", "T: error: not a PyTorch checkout: aten/src/ATen/native/tags.yaml is missing (hint: is "
                         "the checkout complete?)"),
    ("codegen_of_another_shape", "T/tools/autograd/gen_inplace_or_view_type.py: error: the checkout's autograd "
                                 "codegen does not have the shape this tool asks: AttributeError: module "
                                 "'tools.autograd.gen_inplace_or_view_type' has no attribute 'get_view_info' (hint: "
                                 "known to work: the codegen of torch 2.4 to 2.14)"),
])
def test_bad_checkouts_are_one_line_errors_and_write_nothing(tmp_path, case, expected):
    tree = tree_from_installed(str(tmp_path / "pytorch"), git=False)
    _break(tree, case)
    out = tmp_path / "out"
    r = tgp(sys.executable, "gen", "--pytorch-root", tree, "--out", out, cache=tmp_path / "cache")
    assert r.returncode == 2 and r.stdout == ""
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    line = r.stderr.strip().replace(tree, "T")
    if "LINE" in expected:
        head, tail = expected.split("LINE")
        assert line.startswith(head) and line.endswith(tail) and line[len(head):-len(tail)].isdigit(), line
    else:
        assert line == expected
    assert not out.exists()


def test_pytorch_root_excludes_native_functions(run_cli, tree213):
    rc, out, err = run_cli("lint", "--pytorch-root", tree213, "--native-functions", os.path.join(tree213, YAML))
    assert (rc, out) == (2, "")
    assert err == ("torchgen-patch: error: --pytorch-root excludes --native-functions/--tags (hint: the "
                   "checkout's own aten/src/ATen/native/*.yaml are read)\n")


def test_pytorch_root_beside_the_checkouts_own_yaml_path(run_cli, tree213, tmp_path, monkeypatch):
    """A guide's or a hook's `lint PATH` with --pytorch-root . beside it, in the checkout: the path is the
    checkout's own yaml, which --pytorch-root reads already, so the checkout is linted; another file is refused."""
    monkeypatch.chdir(tree213)
    rc, out, err = run_cli("lint", "--pytorch-root", ".", YAML, "--format", "sarif")
    assert rc == 1 and json.loads(out)["runs"][0]["results"], err
    assert out == run_cli("lint", "--pytorch-root", ".", "--format", "sarif")[1]
    other = tmp_path / "native_functions.yaml"
    shutil.copy(YAML, other)
    rc, out, err = run_cli("lint", "--pytorch-root", ".", other)
    assert (rc, out) == (2, "")
    assert err == (f"{other}: error: not the --pytorch-root checkout's own yaml: --pytorch-root lints "
                   "aten/src/ATen/native/native_functions.yaml of the checkout (hint: drop --pytorch-root to lint "
                   "this file with the installed torch's torchgen)\n")


# ---------------------------------------------------------------------------
# without torch


@pytest.mark.parametrize("argv,what", [
    (["build"], "build"),
    (["install"], "install"),
    (["verify", "--op", "aten::_foreach_zero_"], "verify"),
    (["lint", "--runtime"], "lint --runtime"),
    (["scan", "--pytorch-root", "TREE", "--against-runtime"], "--against-runtime"),
    (["lint", "--pytorch-root", "TREE", "--against-runtime"], "--against-runtime"),
])
def test_commands_that_need_torch_say_so(notorch, tree213, argv, what):
    r = tgp(notorch, *[tree213 if a == "TREE" else a for a in argv])
    assert (r.returncode, r.stdout) == (3, ""), r.stderr
    assert r.stderr == (f"torchgen-patch: error: {what} needs torch, and this Python has none (hint: pip install "
                        "'torch>=2.4' (or torchgen-patch[torch]); scan, lint, gen and diff on a checkout "
                        "(--pytorch-root) work without it)\n")


def test_installed_world_without_torch_points_to_the_checkout(notorch):
    r = tgp(notorch, "lint")
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr == ("torchgen-patch: error: no installed torchgen: this Python has no torch (hint: install "
                        "torch, or give --pytorch-root DIR to use a PyTorch checkout's own torchgen)\n")


# A pull request's new operator, written as PyTorch writes its void out= ops: it has both problems (no
# ADInplaceOrView kernel; a VariableType kernel that never refuses inputs requiring grad)
NEW_VOID_OUT = """
- func: chunk_split(Tensor self, int chunks, int dim=0) -> Tensor[]
  variants: function
  dispatch:
    CompositeExplicitAutograd: chunk_split

- func: chunk_split.out(Tensor self, int chunks, int dim=0, *, Tensor(a!)[] out) -> ()
  variants: function
  dispatch:
    CompositeExplicitAutograd: chunk_split_out
"""


def test_real_lintrunner_in_a_checkout_without_torch(notorch, tmp_path, default_scan):
    """PyTorch's own lint job: lintrunner from a venv without torch, in the checkout,
    with the block for PyTorch's repository from lintrunner.toml.example, on a pull request
    that adds a void out= op: both halves are reported, for it and for every op already there."""
    tree = tree_from_installed(str(tmp_path / "pytorch"), git=False)
    text = open(os.path.join(ROOT, "lintrunner.toml.example"), encoding="utf-8").read()
    block = text[text.index("# --- PyTorch's own repository"):]
    from testbed.notorch_venv import entry_point

    cfg = block.replace("'torchgen-patch'", repr(entry_point(notorch, str(tmp_path / "bin"))))
    assert cfg != block
    open(os.path.join(tree, ".lintrunner.toml"), "w").write(cfg)
    # a pull request's own module named like one the tool imports: never run by the lint job
    open(os.path.join(tree, "typing.py"), "w").write(f"open({str(tmp_path / 'hijacked')!r}, 'w')\n")
    with open(os.path.join(tree, YAML), "a", encoding="utf-8") as f:
        f.write(NEW_VOID_OUT)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "t"]):
        subprocess.run(["git", *args], cwd=tree, check=True)
    lintrunner = os.path.join(os.path.dirname(notorch), "lintrunner")
    env = dict(os.environ, PYTHONPATH=ROOT, TORCHGEN_PATCH_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([lintrunner, "--all-files", "--output", "json", "--data-path", str(tmp_path / "lr")],
                       cwd=tree, capture_output=True, text=True, env=env)
    msgs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 1, r.stdout + r.stderr  # lintrunner fails the run on errors
    assert {m["path"] for m in msgs} == {YAML}, r.stdout[:2000] + r.stderr
    lines = open(os.path.join(tree, YAML), encoding="utf-8").read().splitlines()
    new_line = lines.index("- func: chunk_split.out(Tensor self, int chunks, int dim=0, *, Tensor(a!)[] out) -> ()") + 1
    assert sorted((m["name"], m["severity"]) for m in msgs if m["line"] == new_line) == [
        ("missing-inplace-or-view-kernel", "error"), ("out-requires-grad-unchecked", "error")]
    by_rule = {name: {m["description"].split(": ", 1)[0] for m in msgs if m["name"] == name}
               for name in {m["name"] for m in msgs}}
    unchecked = {r.name for r in default_scan.with_gap("out")}
    assert by_rule == {"missing-inplace-or-view-kernel": {r.name for r in default_scan.by_verdict("missing")}
                       | {"aten::chunk_split.out"},
                       "out-requires-grad-unchecked": unchecked | {"aten::chunk_split.out"}}
    assert len(unchecked) > 50  # every out= op of the release, not only the new one
    m = next(m for m in msgs if "aten::_fused_adam_:" in m["description"])
    assert lines[m["line"] - 1].startswith("- func: _fused_adam_(")
    assert not (tmp_path / "hijacked").exists()


# ---------------------------------------------------------------------------
# the import context: fresh modules per content, the caller's own untouched


_DROP_FOREACH_ZERO = """
_parse_struct = parse_native_yaml_struct


def parse_native_yaml_struct(es, *args, **kwargs):  # edited: drops one entry
    return _parse_struct([e for e in es if not e["func"].startswith("_foreach_zero_(")], *args, **kwargs)
"""


def test_an_edit_of_the_checkouts_torchgen_is_seen_in_the_same_process_and_the_next(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHGEN_PATCH_CACHE", str(tmp_path / "cache"))
    from torchgen_patch import pipeline
    from torchgen_patch.sources import Options

    tree = tree_from_installed(str(tmp_path / "pytorch"), git=False)
    first = pipeline.inputs(Options(pytorch_root=tree)).scan
    open(os.path.join(tree, "torchgen", "gen.py"), "a").write(_DROP_FOREACH_ZERO)
    again = pipeline.inputs(Options(pytorch_root=tree)).scan
    assert first.get("aten::_foreach_zero_") is not None and again.get("aten::_foreach_zero_") is None
    assert again.total() < first.total()
    r = tgp(sys.executable, "scan", "--pytorch-root", tree, "--format", "json", cache=tmp_path / "cache")
    assert json.loads(r.stdout)["total"] == again.total()  # a fresh process, from the cache: the same
    assert not [d for d, _, _ in os.walk(tree) if d.endswith("__pycache__")]  # no bytecode in the checkout


def test_the_callers_own_torchgen_is_untouched(tree213):
    import torch  # noqa: F401  (imports the installed torchgen)
    import torchgen
    import torchgen.api.cpp  # noqa: F401

    from torchgen_patch import pipeline
    from torchgen_patch.sources import Options

    mods = {n: m for n, m in sys.modules.items() if n.split(".")[0] == "torchgen"}
    attrs = dict(vars(torchgen))
    pipeline.inputs(Options(no_cache=True))
    pipeline.inputs(Options(pytorch_root=tree213, no_cache=True))
    assert {n: m for n, m in sys.modules.items() if n.split(".")[0] == "torchgen"} == mods
    assert dict(vars(torchgen)) == attrs  # no submodule of the context's attached to the caller's package


def test_run_inside_a_checkout_the_installed_world_is_still_the_installed_torch(tree213, default_scan):
    """`python -m` puts the current directory first on sys.path; a checkout's torchgen/ there
    must not pass for the installed one (PyTorch forks run the lint from their root)."""
    r = tgp(sys.executable, "scan", "--format", "json", cwd=tree213)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["counts"] == default_scan.counts()


def test_a_dangling_symlink_or_a_damaged_cache_costs_nothing_but_time(tmp_path, monkeypatch, run_cli, default_scan):
    monkeypatch.setenv("TORCHGEN_PATCH_CACHE", str(tmp_path / "cache"))
    tree = tree_from_installed(str(tmp_path / "pytorch"), git=False)
    os.symlink("/nonexistent/x.py", os.path.join(tree, "torchgen", "dangling.py"))
    rc, out, err = run_cli("lint", "--pytorch-root", tree)
    assert rc == 1 and out.splitlines()[-1].startswith(f"{len(default_scan.by_verdict('missing'))} finding(s)"), err
    for damage in ("[]", '{"records": [["x"]], "cpp": {}}', '{"records": [], "cpp": {}}', "{"):
        for name in os.listdir(tmp_path / "cache"):
            if name.startswith(("scan-", "overlay-")):
                (tmp_path / "cache" / name).write_text(damage)
        rc, again, _ = run_cli("lint", "--pytorch-root", tree)
        assert (rc, again) == (1, out), damage
