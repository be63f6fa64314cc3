"""The regression test that `diff --mode fix` adds, run before and after on this machine's torch.

A checkout-layout tree is assembled from the installed torch, the fix diff applied with git, and
the tree's test/test_autograd_inplace_or_view.py run twice: on the installed torch as it is, then
under `torchgen-patch run` (this tool's kernels standing in for the rebuilt torch). Prints a
markdown report; exits 1 unless the first run fails and the second passes.

    python scripts/upstream_regression_report.py [--site DIR] > reports/upstream-test-cpu-torch2.13.0.md

--site DIR: put DIR first on the test's path (for a machine without expecttest:
`pip install --no-deps --target DIR expecttest`).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from testbed.upstream_tree import ROOT, failed_tests, make_tree, run_test_file  # noqa: E402
from torchgen_patch.upstream.patch import TEST_FILE  # noqa: E402


def _summary(out: str) -> str:
    ran = re.findall(r"^(Ran \d+ tests.*)$", out, re.M)
    tail = re.findall(r"^(OK.*|FAILED .*)$", out, re.M)
    return "; ".join(ran[-1:] + tail[-1:]) or "no unittest summary (see the output's tail below)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", help="a directory put first on the test's path")
    args = ap.parse_args()
    site = os.path.abspath(args.site) if args.site else None  # the test runs from the tree's test/
    import torch

    device = f"cuda ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else "cpu only"
    with tempfile.TemporaryDirectory() as tmp:
        root = make_tree(os.path.join(tmp, "pytorch"))
        diff = os.path.join(tmp, "fix.diff")
        subprocess.run([sys.executable, "-m", "torchgen_patch", "diff", "--pytorch-root", root, "-o", diff],
                       check=True, env=dict(os.environ, PYTHONPATH=ROOT))
        subprocess.run(["git", "apply", diff], cwd=root, check=True)
        runs = {"without the kernels": run_test_file(root, False, site=site),
                "with the kernels (`torchgen-patch run`)": run_test_file(root, True, site=site)}
    lines = ["# The upstream regression test, before and after", "",
             f"- torch: `{torch.__version__}`; devices: {device}",
             f"- test: `{TEST_FILE}` as `diff --mode fix` adds it, run from the tree's `test/` with `-v`",
             "- command: `python scripts/upstream_regression_report.py"
             + (f" --site {os.path.basename(args.site)}" if args.site else "") + "`", ""]
    for name, r in runs.items():
        out = r.stdout + r.stderr
        failed = sorted(failed_tests(out))
        lines += [f"## {name}", "", f"- exit code: {r.returncode}; {_summary(out)}",
                  f"- failing tests ({len(failed)}):" + ("" if failed else " none")]
        lines += [f"  - `{t}`" for t in failed]
        missing = re.search(r"(\d+ of \d+ operators that mutate arguments.*?:)\n((?:  aten::\S+\n)+)", out, re.M)
        if missing:
            ops = missing.group(2).split()
            lines += ["", f"The registry check: {missing.group(1)}", "", "```", *ops, "```"]
        active = re.findall(r"^(torchgen-patch: .*?)(?:, in pid \d+)?$", out, re.M)
        lines += [f"- `{a}`" for a in active[:1]]
        if r.returncode != 0 and not failed:
            lines += ["", "```", *out.splitlines()[-40:], "```"]
        lines.append("")
    sys.stdout.write("\n".join(lines))
    before, after = runs.values()
    return 0 if before.returncode != 0 and after.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
