"""`diff --issue FILE`: the minimal upstream issue about the fused optimizers, measured on this machine's
torch. Its repro block runs as it stands and prints what the issue says it printed; the versions it
reports are the ones verify measures; the committed one (reports/) is current."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.support import torch_is
from testbed.upstream_tree import make_tree
from torchgen_patch.upstream import issue

COMMITTED = os.path.join(ROOT, "reports", "upstream-issue-cpu-torch2.13.0.md")


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    import contextlib
    import io

    from torchgen_patch import cli

    base = tmp_path_factory.mktemp("issue")
    root = make_tree(str(base / "tree"))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(["diff", "--pytorch-root", root, "-o", str(base / "fix.diff"), "--issue", str(base / "i.md")])
    assert rc == 0, err.getvalue()
    return (base / "i.md").read_text()


def test_the_repro_block_runs_and_prints_what_the_issue_says(text, tmp_path):
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    said = re.search(r"^Output, torch \S+, `cpu`:\n\n```\n(.*?)```", text, re.S | re.M).group(1)
    (tmp_path / "repro.py").write_text(code)
    r = subprocess.run([sys.executable, str(tmp_path / "repro.py")], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == said
    # what it shows: no fused optimizer bumps or raises, the foreach one does
    for name in ("Adam", "AdamW", "SGD"):
        assert f"{name}(fused=True): version +0, no error, gradient of the stepped parameter: True\n" in said
    assert re.search(r"^Adam\(foreach=True\): version \+1, backward raised: one of the variables needed", said, re.M)


def test_the_versions_are_measured_and_cuda_is_said_not_run_where_absent(text):
    import torch

    assert f"Output, torch {torch.__version__}, `cpu`:" in text
    row = re.search(r"^\| `aten::_fused_adam_` \| (.*?) \|", text, re.M).group(1)
    assert row.startswith("`self` 0 → 0 (2 tensors)")
    assert re.search(r"^\| `aten::_foreach_add_\.Scalar` \| `self` 0 → 1 \(2 tensors\)", text, re.M)
    if not torch.cuda.is_available():
        assert "Output on `cuda`: not run here (no such device on this machine)." in text
        assert "- `cuda`: not run here (no such device)." in text
    for n in ("132014", "133044", "64407", "191154"):
        assert f"pytorch/pytorch#{n}" in text


def test_the_repro_names_the_device_it_runs_on():
    assert 'DEVICE = "cuda"' in issue.repro("cuda") and 'DEVICE = "cpu"' not in issue.repro("cuda")


@pytest.mark.skipif(not torch_is("2.13"), reason="the committed issue is measured on torch 2.13 (CPU)")
def test_committed_issue_is_current(text):
    """reports/upstream-issue-cpu-torch2.13.0.md: `make patches` writes it."""
    with open(COMMITTED) as fh:
        assert fh.read() == text, "stale issue text: run `make patches`"


def test_issue_and_instructions_go_with_what_they_need(tmp_path, run_cli):
    root = make_tree(str(tmp_path / "tree"))
    rc, out, err = run_cli("diff", "--pytorch-root", root, "--check", "--issue", tmp_path / "i.md")
    assert (rc, out, err) == (2, "", "torchgen-patch: error: --issue goes without --check\n")
    rc, out, err = run_cli("diff", "--pytorch-root", root, "--instructions", tmp_path / "c.json")
    assert (rc, out, err) == (2, "", "torchgen-patch: error: --instructions goes with --pr-body\n")
    bad = tmp_path / "c.json"
    bad.write_text('{"torch": "2.13.0", "number": 100, "calls": [{"name": "unpatched", "instructions": 1}]}')
    rc, out, err = run_cli("diff", "--pytorch-root", root, "--pr-body", tmp_path / "pr.md", "--instructions", bad)
    assert rc == 2 and out == "" and err == (
        f"{bad}: error: not instruction counts: no instruction count for pytorch-shaped, ours, generated in-place "
        "(hint: give what bench/bench_callgrind.py --json writes)\n")
    assert not (tmp_path / "pr.md").exists() and not (tmp_path / "i.md").exists()
