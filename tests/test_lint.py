"""Issue 2: `torchgen-patch lint` output and exit codes."""

import json

from tests.yaml_fixtures import subset_yaml


def test_lint_reports_missing_ops_and_exits_1(run_cli, default_scan):
    rc, out, err = run_cli("lint")
    assert rc == 1 and err == ""
    lines = out.strip().splitlines()
    findings = lines[:-1]
    assert len(findings) == len(default_scan.by_verdict("missing"))
    r = default_scan.get("aten::split_with_sizes_copy.out")
    assert any(line.endswith(f":{r.loc.line}: error: [VERSIONCOUNTER] aten::split_with_sizes_copy.out: out= op "
                             "writes out and returns nothing: no ADInplaceOrView kernel bumps it") for line in findings)
    assert lines[-1].startswith(f"{len(findings)} finding(s); covered ")


def test_lint_clean_yaml_exits_0(run_cli, tmp_path):
    native, _ = subset_yaml(str(tmp_path), ["add.Tensor", "add_.Tensor", "add.out"])
    rc, out, err = run_cli("lint", "--native-functions", native)
    assert (rc, err) == (0, "")
    assert out.startswith("0 finding(s); covered 2, missing 0")


def test_overlay_skip_accepts_a_finding(run_cli, tmp_path):
    native, _ = subset_yaml(str(tmp_path), ["_cummax_helper", "add.Tensor", "add_.Tensor", "add.out"])
    rc, out, _ = run_cli("lint", "--native-functions", native, "--no-overlay")
    assert rc == 1 and "aten::_cummax_helper" in out
    ov = tmp_path / "o.yaml"
    ov.write_text("aten::_cummax_helper:\n  action: skip\n  reason: known, tracked elsewhere\n")
    rc, out, _ = run_cli("lint", "--native-functions", native, "--overlay", ov)
    assert rc == 0 and out.startswith("0 finding(s)")


def test_lint_json_schema(run_cli, default_scan):
    rc, out, _ = run_cli("lint", "--format", "json")
    assert rc == 1
    doc = json.loads(out)
    assert set(doc) == {"schema_version", "tool", "torch", "native_functions", "counts", "total", "findings"}
    assert doc["schema_version"] == 1 and doc["total"] == len(default_scan.records)
    assert len(doc["native_functions"]) == 1
    assert doc["counts"] == default_scan.counts()
    f = next(f for f in doc["findings"] if f["op"] == "aten::_fused_adam_")
    assert set(f) == {"path", "line", "op", "rule", "message", "severity", "code"}
    assert (f["rule"], f["severity"], f["code"]) == ("missing-inplace-or-view-kernel", "error", "VERSIONCOUNTER")
    assert f["line"] == default_scan.get("aten::_fused_adam_").loc.line


def test_lint_against_runtime(run_cli):
    rc, out, err = run_cli("lint", "--against-runtime")
    assert rc == 1  # the findings; no drift
    assert err.strip().splitlines()[-1].startswith("against runtime: 0 drift(s) over ")


def test_scan_json_lists_every_function(run_cli, default_scan):
    rc, out, _ = run_cli("scan", "--format", "json")
    doc = json.loads(out)
    assert rc == 0 and len(doc["ops"]) == doc["total"] == len(default_scan.records)
    assert sum(doc["counts"].values()) == doc["total"]
