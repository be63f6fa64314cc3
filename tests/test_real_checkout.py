"""The checkout world on PyTorch's real source tree (Debian's source package `pytorch`, fetched with apt
into .cache/pytorch-src/ by tests/debian_source.py; skipped with the reason when it cannot be had), in a
venv without torch; and the release check's report (scripts/pytorch_check.py): its rendering, its
verdicts and the docs' table generated from it. PyTorch's own test files are the release check's, not CI's."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.conftest import ROOT
from tests.debian_source import fetch_tarball, mirror, release_of, tree_from_tarball
from tests.support import script

pc = script("pytorch_check")

REPORT = os.path.join(ROOT, "reports", "pytorch-own-2.6.0.json")


@pytest.fixture(scope="module")
def tarball():
    found, why = fetch_tarball(pc.CACHE, timeout=180)  # a mirror that hangs costs CI minutes, not an hour
    if found is None:
        pytest.skip(f"PyTorch's source tarball is neither cached nor fetchable: {why}")
    return found


def test_the_real_tree_gives_the_matrix_row_and_the_fix_adds_exactly_the_missing(tarball, tmp_path):
    """scan counts = the compatibility matrix's row of the release (made from its wheel), `gen --strict`,
    `diff --mode fix` applied with git and the tree's own codegen before/after, lint after = 0, real
    lintrunner with the tree's own .lintrunner.toml plus the block for PyTorch's repository."""
    t0 = time.monotonic()
    release = release_of(tarball)
    tree = tree_from_tarball(tarball, str(tmp_path / "pytorch"),
                             ["torchgen", "tools", "aten/src/ATen", "version.txt", ".lintrunner.toml"])
    row = pc.step_checkout(tree, str(tmp_path), release)
    assert "failed" not in row, row
    matrix = json.load(open(os.path.join(ROOT, "reports", "compat-matrix.json")))["releases"][release]
    assert row["counts"] == matrix["counts"] and row["total"] == matrix["total"], (row, matrix)
    assert row["matrix_row_same"]
    assert row["upstream_added_are_the_missing"]
    assert row["upstream_after"] - row["upstream_before"] == row["counts"]["missing"] == row["gen_kernels"]
    assert row["patched_findings"] == 0
    assert (row["lintrunner_before"], row["lintrunner_after"]) == (row["findings"], 0) and row["findings"] > 0
    assert row["requires_grad_checks_removed"] == []
    assert row["requires_grad_checks_added_are_the_lint_ops"] and row["requires_grad_checks_added_ops"] > 0
    assert "tools/autograd/gen_inplace_or_view_type.py" in row["fix_edits"]
    assert time.monotonic() - t0 < 120, "the CI half must stay cheap with the tarball cached"


def test_the_mirror_is_the_one_the_machines_apt_sources_name(tmp_path):
    deb822 = tmp_path / "debian.sources"
    deb822.write_text("Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm\n")
    one_line = tmp_path / "sources.list"
    one_line.write_text("# comment\ndeb [arch=amd64] http://other.example/debian bookworm main\n")
    assert mirror([str(tmp_path / "absent"), str(deb822)]) == "http://mirror.example/debian"
    assert mirror([str(one_line)]) == "http://other.example/debian"
    assert mirror([]) == "http://deb.debian.org/debian"


def test_linters_are_matched_by_their_patterns():
    config = {"linter": [
        {"code": "ALLPY", "include_patterns": ["**/*.py"]},
        {"code": "TESTS", "include_patterns": ["test/**/test_*.py"], "exclude_patterns": ["test/run_test.py"]},
        {"code": "TOOLS", "include_patterns": ["tools/**"], "exclude_patterns": ["tools/autograd/*.py"]},
        {"code": "YAML", "include_patterns": ["aten/src/ATen/native/*.yaml"]}]}
    files = ["tools/autograd/gen_inplace_or_view_type.py", "test/test_autograd_inplace_or_view.py"]
    assert pc.linters_for(config, files) == {"ALLPY": files, "TESTS": [files[1]]}


_CASE = {"passed": "", "failed": "<failure message='x'/>", "skipped": "<skipped/>", "error": "<error/>"}


def test_outcomes_are_read_test_by_test_and_a_difference_needs_a_verdict(tmp_path, monkeypatch):
    xml = tmp_path / "r.xml"
    cases = [("test_x.TestA", "test_1", "passed"), ("test_x.TestA", "test_2", "failed"),
             ("test_x.TestB", "test_1", "skipped"), ("test_x.TestB", "test_3", "error")]
    xml.write_text("<testsuites><testsuite>" + "".join(
        f"<testcase classname='{c}' name='{n}'>{_CASE[o]}</testcase>" for c, n, o in cases) + "</testsuite></testsuites>")
    assert pc._junit(str(xml)) == {f"{c}.{n}": o for c, n, o in cases}
    assert pc._junit(str(tmp_path / "absent.xml")) == {}
    data = json.load(open(REPORT))
    group = next(iter(pc.TEST_GROUPS))
    data["tests"][group] = dict(data["tests"].get(group) or {"unpatched": {}, "patched": {}},
                                differ=[{"test": "test_x.TestA.test_2", "unpatched": "passed", "patched": "failed"}])
    assert f"{group}: test_x.TestA.test_2: unjudged" in pc.defects(data)
    monkeypatch.setitem(pc.VERDICTS, "test_x.TestA.test_2", ("intended", "asserted the old counter"))
    assert not [d for d in pc.defects(data) if "test_x" in d]
    monkeypatch.setitem(pc.VERDICTS, "test_x.TestA.test_2", ("defect", "a launcher bug"))
    assert f"{group}: test_x.TestA.test_2: defect" in pc.defects(data)
    # run again alone: one same outcome everywhere is flaky; any difference left needs its verdict
    monkeypatch.delitem(pc.VERDICTS, "test_x.TestA.test_2")
    d = data["tests"][group]["differ"][0]
    d["reruns"] = {"unpatched": ["passed"] * pc.RERUNS, "patched": ["passed"] * pc.RERUNS}
    assert not [x for x in pc.defects(data) if "test_x" in x] and pc.verdict(d)[0] == "flaky"
    d["reruns"]["patched"][-1] = "failed"
    assert f"{group}: test_x.TestA.test_2: unjudged" in pc.defects(data)


def test_report_and_docs_table_are_rendered_from_the_json():
    data = json.load(open(REPORT))
    with open(REPORT[:-len(".json")] + ".md", encoding="utf-8") as f:
        assert f.read() == pc.report_md(data), "stale: run `python scripts/pytorch_check.py --render-only --report`"
    with open(pc.DOC, encoding="utf-8") as f:
        assert pc.doc_block(f.read()) == pc.results_table(data), "docs/release-check.md's table differs from the report"


def test_without_a_cached_tarball_or_apt_the_reason_is_given(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert fetch_tarball(str(tmp_path / "cache")) == (None, "no apt-get on this machine")
    cached = tmp_path / "cache" / "src" / "pytorch_2.6.0+dfsg.orig.tar.xz"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"")
    assert fetch_tarball(str(tmp_path / "cache")) == (str(cached), "")  # a cached one needs no apt
    assert release_of(str(cached)) == "2.6.0"
