"""The checkout world on the real tree, in a venv without torch (compat_matrix.check_tree): the counts,
`gen --strict`, `diff --mode fix` applied with git, the tree's own codegen before and after; real lintrunner
with the tree's .lintrunner.toml plus the VERSIONCOUNTER block for PyTorch's repository, before and after;
the tree's own codegen tests (tools/test/test_codegen.py, with pytest from the tree's root) with the cases
the fix adds, on the unpatched codegen and on the fixed one."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time

import compat_matrix as cm
from testbed.notorch_venv import entry_point, make_venv
from testbed.upstream_tree import codegen_tests_before_after

from .config import REPORTS, ROOT


def _lintrunner(lintrunner: str, tree: str, args: list[str], env: dict, data: str) -> list[dict]:
    r = subprocess.run([lintrunner, "--output", "json", "--data-path", data, *args], cwd=tree, capture_output=True,
                       text=True, env=env)
    msgs = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode not in (0, 1) or (r.returncode == 1 and not msgs):
        raise cm.Failed(f"lintrunner {' '.join(args)}", r)
    return msgs


def _versioncounter_lint(notorch: str, tree: str, work: str) -> int:
    """Real lintrunner, the tree's own .lintrunner.toml plus the block for PyTorch's repository from
    lintrunner.toml.example (as .lintrunner.private.toml, which lintrunner merges by default)."""
    text = open(os.path.join(ROOT, "lintrunner.toml.example"), encoding="utf-8").read()
    tool = entry_point(notorch, os.path.join(work, "bin"))  # the console script pip would write for that venv
    block = text[text.index("# --- PyTorch's own repository"):].replace("'torchgen-patch'", repr(tool))
    with open(os.path.join(tree, ".lintrunner.private.toml"), "w", encoding="utf-8") as f:
        f.write(block)
    env = dict(os.environ, PYTHONPATH=ROOT, TORCHGEN_PATCH_CACHE=os.path.join(work, "cache"))
    msgs = _lintrunner(os.path.join(os.path.dirname(notorch), "lintrunner"), tree,
                       ["--take", "VERSIONCOUNTER", "--all-files"], env, os.path.join(work, "lr"))
    os.remove(os.path.join(tree, ".lintrunner.private.toml"))
    return len(msgs)


def _block_checks_requires_grad() -> bool:
    """Whether the block for PyTorch's repository lints the requires-grad half too (--requires-grad)."""
    text = open(os.path.join(ROOT, "lintrunner.toml.example"), encoding="utf-8").read()
    return "'--requires-grad'" in text[text.index("# --- PyTorch's own repository"):]


def lintrunner_expected(c: dict) -> int:
    """What lintrunner should report on the unpatched tree: `lint`'s findings, and with a block that checks
    both halves (``lintrunner_halves``, recorded by the run) the out= ops of the requires-grad half too."""
    both = c.get("lintrunner_halves") == "both"
    return c["findings"] + (len(c["autograd"]["out-requires-grad-unchecked"]) if both else 0)


def _requires_grad_checks(out: str) -> set[str]:
    """VariableType kernels that refuse out= arguments requiring grad (`throw_error_out_requires_grad`)."""
    found = set()
    for name in sorted(os.listdir(out)):
        if re.fullmatch(r"VariableType_\d+\.cpp", name):
            text = open(os.path.join(out, name), encoding="utf-8").read()
            for m in re.finditer(r"^\S[^\n]*?\b(\w+)\(c10::DispatchKeySet ks[^\n]*\{\n(.*?)^\}\n", text, re.S | re.M):
                if "throw_error_out_requires_grad" in m.group(2):
                    found.add(m.group(1))
    return found


def fix_files(work: str) -> list[str]:
    """The files `diff --mode fix` (work/fix.diff) adds or edits, tree-relative."""
    return sorted(set(re.findall(r"^\+\+\+ b/(\S+)", open(os.path.join(work, "fix.diff")).read(), re.M)))


def codegen_tests(tree: str, work: str) -> dict:
    """tools/test/test_codegen.py with the fix's cases (work/fix.diff), the codegen unpatched then fixed, with
    pytest in a venv without torch; the tree is left fixed. Outcomes summed, and each new case's."""
    python = make_venv(os.path.join(ROOT, ".cache", "notorch-pytest"), ["pytest"])
    try:
        r = codegen_tests_before_after(tree, open(os.path.join(work, "fix.diff")).read(), python, work)
    except RuntimeError as e:
        raise cm.Failed("tools/test/test_codegen.py", subprocess.CompletedProcess([], 1, "", str(e))) from None
    old = [t for t in r["before"] if t not in r["cases"]]
    return {"cases": {t: [r["before"].get(t, "absent"), r["after"][t]] for t in r["cases"]},
            "others_before": {k: sum(r["before"][t] == k for t in old) for k in ("passed", "failed", "skipped")},
            "others_after": {k: sum(r["after"].get(t) == k for t in old) for k in ("passed", "failed", "skipped")}}


def codegen_tests_pass(t: dict | None) -> bool:
    """Each case passes with the fix, at least one fails without it, and the file's other tests keep theirs."""
    return bool(t) and all(after == "passed" for _, after in t["cases"].values()) and \
        any(before == "failed" for before, _ in t["cases"].values()) and t["others_before"] == t["others_after"]


def step_checkout(tree: str, work: str, release: str) -> dict:
    """The checkout world on the tree (compat_matrix.check_tree) with real lintrunner before and after, the
    requires-grad checks of the tree's VariableType before and after, and the comparison with the matrix row."""
    notorch = make_venv(os.path.join(ROOT, ".cache", "notorch-venv"), ["lintrunner"])
    row: dict = {}
    t0 = time.monotonic()
    try:
        row["lintrunner_halves"] = "both" if _block_checks_requires_grad() else "version-counter"
        row["lintrunner_before"] = _versioncounter_lint(notorch, tree, work)
        cm.check_tree(tree, notorch, work, row)
        row["lintrunner_after"] = _versioncounter_lint(notorch, tree, work)
        row["codegen_tests"] = codegen_tests(tree, work)
    except cm.Failed as e:
        row["failed"] = str(e)
    if "upstream_after" in row:
        old, new = _requires_grad_checks(os.path.join(work, "up0")), _requires_grad_checks(os.path.join(work, "up1"))
        row["requires_grad_checks_before"], row["requires_grad_checks_after"] = len(old), len(new)
        row["requires_grad_checks_added"] = sorted(new - old)
        row["requires_grad_checks_removed"] = sorted(old - new)
        # the kernels gaining the check, as ops (`<op>_out_<overload>`, nested-tensor kernels of the same op
        # folded in), must be exactly the out= ops of lint --autograd's rule on the unpatched tree
        gained = sorted({f"aten::{m.group(1)}.{m.group(2)}" for m in
                         (re.fullmatch(r"(.+?)_out_(.+?)(?:_AutogradNestedTensor)?", k) for k in new - old) if m})
        row["requires_grad_checks_added_ops"] = len(gained)
        row["requires_grad_checks_added_are_the_lint_ops"] = (
            gained == sorted(row.get("autograd", {}).get("out-requires-grad-unchecked", [None])))
        row["fix_edits"] = fix_files(work)
    matrix = json.load(open(os.path.join(REPORTS, "compat-matrix.json")))["releases"].get(release, {})
    keys = ("total", "counts", "gen_kernels", "gen_left_out", "upstream_before", "upstream_after", "patched_findings")
    row["matrix_row_same"] = bool(matrix) and all(row.get(k) == matrix.get(k) for k in keys)
    row["wall_s"] = round(time.monotonic() - t0, 1)
    return row


def apply_fix(tree: str, work: str) -> None:
    """The fix applied to the tree for the steps that follow, when the checkout step did not apply it (not
    run, or failed): work/fix.diff made again in work/again."""
    notorch = make_venv(os.path.join(ROOT, ".cache", "notorch-venv"), ["lintrunner"])
    try:
        cm.check_tree(tree, notorch, os.path.join(work, "again"), {})
    except cm.Failed as e:
        sys.exit(f"error: the fix does not apply to the tree: {e}")
    shutil.copy(os.path.join(work, "again", "fix.diff"), os.path.join(work, "fix.diff"))
