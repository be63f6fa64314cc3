"""Issue 6: the diff for PyTorch's own codegen, validated by running that codegen
from a source-tree fixture assembled from the installed wheel."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.support import torch_is
from testbed.upstream_tree import failed_tests, kernels_tu, make_tree, registrations, run_codegen, run_test_file
from torchgen_patch.upstream import patch as up
from torchgen_patch.upstream.codegen_test import CODEGEN_TEST

PATCHES = os.path.join(ROOT, "patches")


def _apply(root, diff_text, check=True):
    p = os.path.join(root, "p.diff")
    with open(p, "w") as fh:
        fh.write(diff_text)
    return subprocess.run(["git", "apply"] + (["--check"] if check else []) + [p], cwd=root,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def trees(tmp_path_factory, run_cli_module):
    """The unpatched codegen's output and the fix-patched one's, run once."""
    base = tmp_path_factory.mktemp("upstream")
    root = make_tree(str(base / "tree"))
    unpatched = run_codegen(root, str(base / "out0"))
    assert unpatched.returncode == 0, unpatched.stderr
    rc, diff_text, err = run_cli_module("diff", "--pytorch-root", root)
    assert rc == 0, err
    assert _apply(root, diff_text).returncode == 0
    assert _apply(root, diff_text, check=False).returncode == 0
    patched = run_codegen(root, str(base / "out1"))
    assert patched.returncode == 0, patched.stderr
    return root, str(base / "out0"), str(base / "out1"), diff_text


@pytest.fixture(scope="module")
def run_cli_module():
    import contextlib
    import io

    from torchgen_patch import cli

    def run(*argv):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main([str(a) for a in argv])
        return rc, out.getvalue(), err.getvalue()

    return run


def test_diff_is_relative_and_git_applies(trees):
    root, _, _, diff_text = trees
    assert diff_text.startswith(f"--- a/{up.TARGET}\n+++ b/{up.TARGET}\n")
    assert root not in diff_text
    # the files it touches, in order: the codegen, its autograd half, the codegen's own tests (a tree
    # assembled from a wheel has none: created), the regression test
    assert re.findall(r"^\+\+\+ b/(\S+)", diff_text, re.M) == [up.TARGET, up.VT_TARGET, CODEGEN_TEST, up.TEST_FILE]


def test_second_application_is_refused(trees, run_cli):
    root, _, _, diff_text = trees
    r = _apply(root, diff_text)
    assert r.returncode != 0 and "patch does not apply" in r.stderr
    rc, out, err = run_cli("diff", "--pytorch-root", root)
    assert rc == 2 and err == (f"{os.path.join(root, up.TARGET)}: error: already applied (mode fix) "
                               "(hint: nothing to do; `--check` reports it)\n")
    assert run_cli("diff", "--pytorch-root", root, "--check")[:2] == (0, f"{up.TARGET}: patched (mode fix)\n")


def _files(d):
    out = {}
    for dirpath, _, names in os.walk(d):
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = fh.read()
    return out


def test_only_the_inplace_or_view_and_variable_type_files_change(trees):
    _, out0, out1, _ = trees
    a, b = _files(out0), _files(out1)
    assert sorted(a) == sorted(b) and len(a) > 20
    changed = sorted(n for n in a if a[n] != b[n])
    vt = sorted(n for n in a if re.fullmatch(r"VariableType(_\d+|Everything)\.cpp", n))
    assert len(vt) > 2
    assert changed == sorted(["ADInplaceOrViewTypeEverything.cpp", "ADInplaceOrViewType_0.cpp",
                              "ADInplaceOrViewType_1.cpp", *vt])


_VT_REG = re.compile(r'm\.impl\("([^"]+)",\s*TORCH_FN\(VariableType::(\w+)\)\s*\);', re.S)
_VT_FN = re.compile(r"^\S[^\n]*?\b(\w+)\(c10::DispatchKeySet ks[^\n]*\{\n.*?^\}\n", re.S | re.M)
_REFUSAL = re.compile(r'  if \(compute_requires_grad\( [\w, ]+ \)\) \{\n'
                      r'    throw_error_out_requires_grad\("\w+"\);\n  \}\n')


def test_variable_type_gains_the_check_for_exactly_the_lint_ops(trees, run_cli):
    """The fixed tree's own codegen: VariableType kernels gain throw_error_out_requires_grad
    (inputs, then outputs) for exactly the ops lint --autograd reports, and nothing else changes."""
    import difflib

    root, out0, out1, _ = trees
    rc, out, _ = run_cli("lint", "--autograd", "--format", "json", "--no-overlay")
    unchecked = {f["op"].split("::", 1)[1] for f in json.loads(out)["findings"]
                 if f["rule"] == "out-requires-grad-unchecked"}
    assert unchecked and (len(unchecked) == 95 or not torch_is("2.13"))
    changed_ops = set()
    for name in sorted(os.listdir(out0)):
        if not re.fullmatch(r"VariableType_\d+\.cpp", name):
            continue
        old, new = (open(os.path.join(d, name)).read() for d in (out0, out1))
        # only insertions, each a whole refusal block
        sm = difflib.SequenceMatcher(None, old.splitlines(True), new.splitlines(True), autojunk=False)
        for tag, i1, i2, j1, j2 in sm.get_opcodes():
            assert tag in ("equal", "insert"), (name, tag, old.splitlines()[i1:i2])
            if tag == "insert":
                assert _REFUSAL.sub("", "".join(new.splitlines(True)[j1:j2])) == "", name
        ops_of = {fn: op for op, fn in _VT_REG.findall(new)}
        fns_old = {m.group(1): m.group(0) for m in _VT_FN.finditer(old)}
        for m in _VT_FN.finditer(new):
            if fns_old.get(m.group(1)) != m.group(0):
                changed_ops.add(ops_of[m.group(1)])
                assert m.group(0).count("throw_error_out_requires_grad(") == 2, m.group(0)
    assert changed_ops == unchecked
    # and the patched checkout's own codegen, asked again, leaves no out= op unchecked
    rc, out, _ = run_cli("lint", "--autograd", "--format", "json", "--pytorch-root", root)
    assert {f["rule"] for f in json.loads(out)["findings"]} == {"inplace-check-missing"}


def test_new_kernels_are_exactly_the_plan(trees, default_scan):
    _, out0, out1, _ = trees
    new = set(registrations(out1)) - set(registrations(out0))
    assert set(registrations(out0)) <= set(registrations(out1))
    # the plan before the overlay: every missing op (the overlay only skips unsupported ones)
    assert {f"aten::{n}" for n in new} == {r.name for r in default_scan.by_verdict("missing")}


@pytest.mark.build
def test_upstream_kernels_compile_and_pass_the_version_tests(trees, tmp_path, default_plan):
    _, out0, out1, _ = trees
    regs0, regs1 = registrations(out0), registrations(out1)
    new = {op: fn for op, fn in regs1.items() if op not in regs0}
    src = tmp_path / "upstream_kernels.cpp"
    src.write_text(kernels_tu(out1, new))
    code = f"""
import json, sys, torch
sys.path.insert(0, {ROOT!r})
from torch.utils import cpp_extension
from torchgen_patch.checks import verify
ops = {json.dumps(default_plan.ops())}
before = verify.run(ops, "cpu", False)
cpp_extension.load("upstream_kernels", [{str(src)!r}], extra_cflags=["-O1", "-w"],
                   build_directory={str(tmp_path)!r}, is_python_module=False)
after = verify.run(ops, "cpu", True)
cuda = verify.run(ops, "cuda", True) if torch.cuda.is_available() else []
print(json.dumps({{"before": verify.counts(before), "after": verify.counts(after),
                  "bad": [r.op for r in after + cuda if r.verdict in verify.FAILING],
                  "cuda": verify.counts(cuda)}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, PYTHONPATH=ROOT, MAX_JOBS="2"))
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["bad"] == []
    assert res["before"].get("MISS", 0) > 0
    assert res["after"] == {"PASS": len(default_plan.ops()) - 3, "NOT_RUN": 3}
    import torch

    if torch.cuda.is_available():  # on the GPU machine: the same kernels on CUDA
        assert res["cuda"].get("PASS", 0) >= len(default_plan.ops()) - 6, res["cuda"]


def test_fix_adds_a_regression_test_that_needs_only_torch(trees):
    root, _, _, diff_text = trees
    assert f"--- /dev/null\n+++ b/{up.TEST_FILE}\n" in diff_text
    with open(os.path.join(root, up.TEST_FILE)) as fh:
        text = fh.read()
    assert text == up.TEST_SOURCE and text.startswith('# Owner(s): ["module: autograd"]\n')
    imported = set(re.findall(r"^(?:from|import) ([\w.]+)", text, re.M))
    assert imported == {"torch", "torch.testing._internal.common_device_type",
                        "torch.testing._internal.common_methods_invocations",
                        "torch.testing._internal.common_optimizers", "torch.testing._internal.common_utils"}


# The test file's cases that fail on CPU without the kernels (torch 2.13 and 2.11 alike: the CPU
# kernels of these ops never bump), and, on a CUDA machine, the CUDA-only misses.
CPU_FAILS = {"test_mutating_ops_without_returns_have_inplace_or_view_kernels",
             "test_amp_foreach_non_finite_check_and_unscale__cpu", "test_cummax_helper_cummax_cpu_float32",
             "test_fused_optimizer_ops_cpu"} | {
    f"test_fused_optimizer_step_before_backward_raises_{o}_cpu_float32"
    for o in ("Adagrad", "Adam", "AdamW", "SGD")} | {
    # the requires-grad half: out= ops that return nothing refuse inputs and outputs that require grad
    f"test_{t}_cpu" for t in ("split_with_sizes_copy_out", "unbind_copy_and_unsafe_split_out", "foreach_out")}


@pytest.mark.build
def test_regression_test_fails_unpatched_and_passes_patched(trees, default_scan):
    if importlib.util.find_spec("expecttest") is None:
        pytest.skip("expecttest is not installed (torch's test utilities import it; requirements-dev.txt pins it)")
    root = trees[0]
    before, after = run_test_file(root, False), run_test_file(root, True)
    out = before.stdout + before.stderr
    ran = re.findall(r"^Ran (\d+) tests", out, re.M)
    assert before.returncode == 1 and ran, out[-3000:]
    missing = sorted(r.name for r in default_scan.by_verdict("missing"))
    assert f"{len(missing)} of {len(missing)} operators that mutate arguments and return nothing" in out
    assert re.findall(r"^  (aten::\S+)$", out, re.M) == missing
    failed = failed_tests(out)
    assert {t for t in failed if not t.endswith("_cuda") and "_cuda_" not in t} == CPU_FAILS
    out_after = after.stdout + after.stderr
    assert after.returncode == 0, out_after[-3000:]
    assert re.findall(r"^Ran (\d+) tests", out_after, re.M) == ran and "\nOK" in out_after
    assert "kernels active" not in out  # the unpatched run had none
    assert re.search(r"^torchgen-patch: \d+ kernels active \(cpp\), 0 refused", out_after, re.M)


def _tool(name: str) -> list[str]:
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed (requirements-dev.txt pins it)")
    return [sys.executable, "-m", name]


PYTORCH_RUFF = os.path.join(ROOT, "tests", "pytorch_ruff.toml")  # PyTorch's own ruff settings
RUFF_SETTINGS = {"pytorch": ["--config", PYTORCH_RUFF], "default": ["--isolated"]}


def ruff_findings(root: str, rel: str, settings: str = "pytorch") -> list[tuple[str, str]]:
    """`ruff check` with PyTorch's settings (the assembled tree has no pyproject) or ruff's
    defaults: (code, the flagged line)."""
    r = subprocess.run(_tool("ruff") + ["check", *RUFF_SETTINGS[settings], "--output-format", "json", rel],
                       cwd=root, capture_output=True, text=True)
    with open(os.path.join(root, rel)) as fh:
        lines = fh.read().splitlines()
    return sorted((f["code"], lines[f["location"]["row"] - 1].strip()) for f in json.loads(r.stdout))


def test_codegen_and_test_pass_ruff_and_mypy(trees, tmp_path, run_cli):
    fixed = trees[0]
    original = make_tree(str(tmp_path / "original"))
    guarded = make_tree(str(tmp_path / "error"))
    rc, diff_text, _ = run_cli("diff", "--pytorch-root", guarded, "--mode", "error")
    assert rc == 0 and _apply(guarded, diff_text, check=False).returncode == 0
    # PyTorch's settings: the edited codegen (both modes) and the new test file are clean
    for root, rel in ((original, up.TARGET), (fixed, up.TARGET), (guarded, up.TARGET), (fixed, up.TEST_FILE),
                      (fixed, CODEGEN_TEST), (guarded, CODEGEN_TEST)):
        assert ruff_findings(root, rel) == [], (root, rel)
    for root in (fixed, guarded):  # gen_variable_type.py: the edit adds no finding to what PyTorch's has
        for settings in RUFF_SETTINGS:
            assert ruff_findings(root, up.VT_TARGET, settings) == ruff_findings(original, up.VT_TARGET, settings)
    # ruff's defaults select more (isort, TRY004): PyTorch's file has some today; the change adds none
    before = ruff_findings(original, up.TARGET, "default")
    assert ruff_findings(fixed, up.TARGET, "default") == before and \
        ruff_findings(guarded, up.TARGET, "default") == before
    # ...except isort's import order (I001): the test file's imports are ordered as PyTorch's own formatter
    # (usort, its PYFMT linter) orders them, case-insensitively; the release check runs that adapter
    assert [f for f in ruff_findings(fixed, up.TEST_FILE, "default") if f[0] != "I001"] == []
    for root, rel in ((fixed, up.TARGET), (guarded, up.TARGET), (fixed, up.TEST_FILE), (original, up.TARGET),
                      (fixed, up.VT_TARGET), (guarded, up.VT_TARGET), (original, up.VT_TARGET),
                      (fixed, CODEGEN_TEST), (guarded, CODEGEN_TEST)):
        for settings in RUFF_SETTINGS.values():
            r = subprocess.run(_tool("ruff") + ["format", *settings, "--check", rel], cwd=root,
                               capture_output=True, text=True)
            assert r.returncode == 0, (root, rel, settings, r.stdout, r.stderr)
    cache = os.path.join(ROOT, ".cache", "mypy")  # mypy follows torch's imports: minutes cold, seconds warm
    for root, files in ((fixed, [up.TARGET, up.VT_TARGET, up.TEST_FILE, CODEGEN_TEST]),
                        (guarded, [up.TARGET, up.VT_TARGET, CODEGEN_TEST])):
        r = subprocess.run(_tool("mypy") + ["--follow-imports=silent", "--cache-dir", cache, *files], cwd=root,
                           capture_output=True, text=True, timeout=1800)
        assert r.returncode == 0 and r.stdout.startswith("Success: no issues found"), r.stdout[-3000:]


def test_error_mode_fails_the_codegen_listing_the_ops(tmp_path, run_cli, default_scan):
    root = make_tree(str(tmp_path / "tree"))
    rc, diff_text, _ = run_cli("diff", "--pytorch-root", root, "--mode", "error")
    assert rc == 0 and _apply(root, diff_text, check=False).returncode == 0
    # gen_variable_type runs first: it stops at the first out= op that returns nothing
    r = run_codegen(root, str(tmp_path / "out"))
    assert r.returncode != 0
    unchecked = sorted(r.name.split("::", 1)[1] for r in default_scan.with_gap("out"))
    first = re.search(r"native_functions\.yaml:\d+: (\S+) \(out=\) returns nothing, so its VariableType kernel "
                      r"would not refuse inputs or outputs that require grad", r.stderr)
    assert first and first.group(1) in unchecked, r.stderr[-2000:]
    vt = os.path.join(root, up.VT_TARGET)
    text = open(vt).read()
    listed = "OUT_FUNCTIONS_WITHOUT_REQUIRES_GRAD_CHECK: set[str] = set()"
    assert text.count(listed) == 1
    open(vt, "w").write(text.replace(listed, listed.replace("set()", "{" + ", ".join(map(repr, unchecked)) + "}")))
    r = run_codegen(root, str(tmp_path / "out"))
    assert r.returncode != 0
    missing = default_scan.by_verdict("missing")
    assert f"{len(missing)} operators mutate arguments and return nothing" in r.stderr
    rec = default_scan.get("aten::split_with_sizes_copy.out")
    assert f"native_functions.yaml:{rec.loc.line}: split_with_sizes_copy.out (out=)\n" in r.stderr
    listed = re.findall(r"^  (\S+):(\d+): (\S+) \((out=|in-place|mutable)\)$", r.stderr, re.M)
    assert len(listed) == len(missing)
    # by file, then by line as a number (":7709" before ":10425"), then by name
    assert listed == sorted(listed, key=lambda t: (t[0], int(t[1]), t[2]))
    kinds = {"out": "out=", "inplace": "in-place", "mutable": "mutable"}
    assert sorted((n, k) for _, _, n, k in listed) == sorted(
        (m.name.split("::", 1)[1], kinds[m.kind]) for m in missing)
    # the allowlist the patch adds accepts them
    path = os.path.join(root, up.TARGET)
    text = open(path).read()
    names = ", ".join(repr(r.name.split("::", 1)[1]) for r in missing)
    text = text.replace("MUTATING_OPS_WITHOUT_INPLACE_OR_VIEW_KERNEL: set[str] = set()",
                        f"MUTATING_OPS_WITHOUT_INPLACE_OR_VIEW_KERNEL: set[str] = {{{names}}}")
    open(path, "w").write(text)
    assert run_codegen(root, str(tmp_path / "out2")).returncode == 0


def test_wrong_shape_fails_clearly(tmp_path, run_cli):
    root = make_tree(str(tmp_path / "tree"))
    path = os.path.join(root, up.TARGET)
    text = open(path).read().replace("def emit_inplace_or_view_body(", "def emit_body_renamed(")
    open(path, "w").write(text)
    rc, out, err = run_cli("diff", "--pytorch-root", root)
    assert rc == 2 and out == ""
    assert err == (f"{path}: error: the codegen does not have the shape this patch expects: function "
                   f"emit_inplace_or_view_body() not found (hint: known to work: {up.KNOWN_GOOD})\n")


def test_not_a_tree(run_cli, tmp_path):
    rc, _, err = run_cli("diff", "--pytorch-root", tmp_path)
    assert rc == 2 and err == f"{tmp_path / up.TARGET}: error: the autograd codegen not found\n"


@pytest.mark.skipif(not torch_is("2.13"), reason="the committed example is torch 2.13's")
@pytest.mark.parametrize("mode", ["fix", "error"])
def test_committed_example_is_current(tmp_path, run_cli, mode):
    """patches/ holds the diffs for torch 2.13; regenerate with `make patches`."""
    root = make_tree(str(tmp_path / "tree"))
    rc, diff_text, _ = run_cli("diff", "--pytorch-root", root, "--mode", mode)
    assert rc == 0
    with open(os.path.join(PATCHES, f"gen_inplace_or_view_type-{mode}-torch2.13.diff")) as fh:
        assert fh.read() == diff_text, "stale example diff: run `make patches`"


@pytest.mark.build
@pytest.mark.skipif(not torch_is("2.13"), reason="the committed description is measured on torch 2.13 (CPU)")
def test_committed_pr_body_is_current(tmp_path):
    """patches/pr-body-torch2.13.md: `diff --pr-body`, regenerated with `make patches`."""
    root = make_tree(str(tmp_path / "tree"))
    body = tmp_path / "pr.md"
    counts = os.path.join(ROOT, "reports", "bench-callgrind-cpu-torch2.13.0.json")  # what `make bench` committed
    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "diff", "--pytorch-root", root, "-o",
                        str(tmp_path / "fix.diff"), "--pr-body", str(body), "--instructions", counts],
                       env=dict(os.environ, PYTHONPATH=ROOT),
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    with open(os.path.join(PATCHES, "pr-body-torch2.13.md")) as fh:
        assert fh.read() == body.read_text(), "stale example description: run `make patches`"


def test_pr_body_goes_with_the_fix_only(tmp_path, run_cli):
    root = make_tree(str(tmp_path / "tree"))
    for extra in (["--mode", "error"], ["--check"]):
        rc, out, err = run_cli("diff", "--pytorch-root", root, "--pr-body", tmp_path / "pr.md", *extra)
        assert (rc, out, err) == (2, "", "torchgen-patch: error: --pr-body goes with --mode fix, without --check\n")
    assert not (tmp_path / "pr.md").exists()
