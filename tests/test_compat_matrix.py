"""The compatibility matrix (reports/compat-matrix.md, scripts/compat_matrix.py): the committed
report, its json and the table of docs/compatibility.md agree; every release from 2.4 to the newest is in it;
the package's torch lower bound is the oldest release the evidence supports."""

from __future__ import annotations

import os
import re

import pytest

from tests.conftest import ROOT
from tests.support import script

cm = script("compat_matrix")

JSON = os.path.join(ROOT, "reports", "compat-matrix.json")


@pytest.fixture(scope="module")
def data():
    import json

    with open(JSON) as f:
        return json.load(f)


def _minor(release: str) -> tuple[int, int]:
    return tuple(int(x) for x in release.split(".")[:2])


def test_last_patch_of_each_release_from_2_4():
    seen = ["2.15.0", "2.14.1", "2.14.0", "2.13.0+cpu", "2.13.0", "2.10.0", "2.9.1", "2.9.0", "2.5.1",
            "2.5.0", "2.4.1", "2.4.0", "2.3.1", "2.16.0rc1", "1.13.1"]
    assert cm.last_patches(seen) == ["2.4.1", "2.5.1", "2.9.1", "2.10.0", "2.13.0", "2.14.1", "2.15.0"]


@pytest.mark.parametrize("line, expected", [
    ("296 passed, 12 skipped in 581.13s (0:09:41)", {"passed": 296, "skipped": 12}),
    ("==== 3 failed, 290 passed, 15 skipped, 1 error in 12.50s ====",
     {"failed": 3, "passed": 290, "skipped": 15, "error": 1}),
    ("======================== 37 passed in 122.95s (0:02:02) ========================", {"passed": 37}),
    ("1 failed, 9 passed, 12 skipped, 4 warnings in 338.93s (0:05:38)", {"failed": 1, "passed": 9, "skipped": 12}),
])
def test_pytest_summary_lines(line, expected):
    assert cm.pytest_summary(f"....\nsome output\n{line}\n") == expected


def test_failed_tests_are_counted_against_their_area():
    text = "FAILED tests/test_verify.py::test_x - AssertionError\nERROR tests/test_build.py::test_y\n"
    assert cm.failed_files(text) == {"tests/test_verify.py", "tests/test_build.py"}


def test_report_and_compatibility_page_are_rendered_from_the_json(data):
    with open(os.path.join(ROOT, "reports", "compat-matrix.md"), encoding="utf-8") as f:
        assert f.read() == cm.report_md(data), "stale: run `make matrix REPORT=1 MATRIX_ARGS=--render-only`"
    with open(os.path.join(ROOT, "docs", "compatibility.md"), encoding="utf-8") as f:
        assert cm.page_block(f.read()) == cm.page_table(data), "docs/compatibility.md's table differs from the report"


def test_every_release_from_2_4_to_the_newest_is_listed(data):
    releases = sorted(data["releases"], key=cm._key)
    newest = _minor(data["index_newest"])
    assert [_minor(r) for r in releases] == [(2, m) for m in range(4, newest[1] + 1)]
    for r in releases:
        row = data["releases"][r]
        assert "not_checked" in row or "failed" in row or "patched_findings" in row, r


def _supported(data, release: str) -> bool:
    row, rt = data["releases"][release], cm.runtime(release)
    return (cm.static_cell(row).startswith("ok") and rt is not None and all(rt["areas"].values())
            and not rt["counts"].get("failed") and not rt["counts"].get("error"))


def test_torch_lower_bound_is_the_oldest_release_with_evidence(data):
    """pyproject's torch>=X.Y is the oldest release whose static checks pass and whose suite ran
    on it without a failure; every checked release after it passes its static checks."""
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        bound = re.search(r'torch = \["torch>=(\d+\.\d+)"\]', f.read()).group(1)
    run = [r for r in sorted(data["releases"], key=cm._key) if _supported(data, r)]
    assert run, "no release has runtime evidence"
    assert bound == ".".join(run[0].split(".")[:2])
    later = [r for r in data["releases"] if cm._key(r) >= cm._key(run[0]) and "not_checked" not in data["releases"][r]]
    assert all(cm.static_cell(data["releases"][r]).startswith("ok") for r in later)


def test_a_rerun_replaces_the_results_of_the_failed_tests():
    text = ("..F.F.s\nFAILED tests/test_verify.py::a\nFAILED tests/test_build.py::b\n"
            "2 failed, 4 passed, 1 skipped in 9.0s\n"
            "# rerun of the failed tests above\n.s\nSKIPPED [1] tests/test_build.py:3: why\n1 passed, 1 skipped in "
            "1.0s\n")
    assert cm.combined(text) == ({"passed": 5, "skipped": 2}, set(), 2)
    still = text.replace("1 passed, 1 skipped in 1.0s", "FAILED tests/test_verify.py::a\n1 failed, 1 skipped in 1.0s")
    assert cm.combined(still) == ({"failed": 1, "passed": 4, "skipped": 2}, {"tests/test_verify.py"}, 2)
    # a rerun of other tests than the failed ones is not taken
    assert cm.combined(text.replace("1 passed, 1 skipped", "3 passed"))[0] is None


# ---------------------------------------------------------------------------
# a torch built from source (scripts/check_source_build.sh)

SOURCE_BUILD = os.path.join(ROOT, "scripts", "check_source_build.sh")


def test_source_build_script_parses_and_its_dry_run_changes_nothing(tmp_path):
    """The full run (debootstrap, apt-get, the checks) is `make source-build` evidence, not a test:
    here, both scripts parse and the dry run names each step without running one."""
    import subprocess

    for name in ("check_source_build.sh", "source_build_checks.sh"):
        r = subprocess.run(["bash", "-n", os.path.join(ROOT, "scripts", name)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    root, out = tmp_path / "root", tmp_path / "py"
    r = subprocess.run(["bash", SOURCE_BUILD, "--dry-run"], capture_output=True, text=True,
                       env=dict(os.environ, SOURCE_BUILD_ROOT=str(root), PYTHON=str(out)))
    assert r.returncode == 0, r.stderr
    steps = [line[len("source-build: $ "):] for line in r.stderr.splitlines() if line.startswith("source-build: $ ")]
    assert f"debootstrap --variant=minbase trixie {root} http://deb.debian.org/debian" in steps
    apt = next(s for s in steps if "apt-get install" in s and "--no-install-recommends" in s)  # inside the root
    for package in ("python3-torch", "libtorch-dev", "g++", "ninja-build", "python3-yaml", "python3-jinja2"):
        assert f" {package}" in apt, (package, apt)
    assert "inside /opt/tgp/bin/pip install -q --no-deps --no-build-isolation /opt/torchgen-patch-src" in steps
    assert steps[-2:] == [f"cp -r {root}/out {ROOT}/build/source-build",
                          f"{out} {ROOT}/scripts/compat_matrix.py --source-build {ROOT}/build/source-build"]
    assert not root.exists() and not out.exists()


def test_source_build_report_and_row_are_rendered_from_its_json(data):
    import json

    names = data.get("source_builds", [])
    assert names == ["source-build-torch2.6.0-debian.json"]
    sb = json.load(open(os.path.join(ROOT, "reports", names[0]), encoding="utf-8"))
    with open(os.path.join(ROOT, "reports", names[0][:-len(".json")] + ".md"), encoding="utf-8") as f:
        assert f.read() == cm.source_build_md(sb), "stale: run `make source-build REPORT=1`"
    row = cm.source_build_row(sb, data["releases"].get(sb["release"]))
    assert row in cm.page_table(data).splitlines()
    table = cm.page_table(data).splitlines()
    wheel = next(i for i, line in enumerate(table) if line.startswith(f"| {sb['release']} |"))
    assert table[wheel + 1] == row  # under the release it was built from


def test_source_build_row_says_no_where_a_check_failed():
    """A source build whose patched verify missed an op, or whose program ran unpatched, is not a yes."""
    import json

    sb = json.load(open(os.path.join(ROOT, "reports", "source-build-torch2.6.0-debian.json"), encoding="utf-8"))
    assert cm.source_build_md(sb).split("## Verdict\n\n", 1)[1].startswith("passes\n")
    bad = json.loads(json.dumps(sb))
    bad["verify"]["with patch (cpp)"] = {"MISS": 1, "PASS": 169, "NOT_RUN": 3}
    bad["programs"]["run"] = {"version_bumps": 0, "backward_raised": ""}
    row = cm.source_build_row(bad, None)
    assert "| **no**: " in row and "`run`: **no**" in row
    assert cm.source_build_md(bad).split("## Verdict\n\n", 1)[1].startswith("**fails**: verify, run\n")
