"""Scanning: every function of the yaml classified into exactly one verdict."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.support import torch_is
from tests.support import packaged_yaml, scan_of
from torchgen_patch import cache
from torchgen_patch.diagnostics.drift import cross_check
from torchgen_patch.scan.model import COMPOSITE, COVERED, MISSING, NOT_MUTATING, UNSUPPORTED, VERDICTS


def test_every_function_lands_in_exactly_one_bucket(default_scan):
    counts = default_scan.counts()
    assert sum(counts.values()) == len(default_scan.records)
    assert set(counts) == set(VERDICTS)
    assert len({r.name for r in default_scan.records}) == len(default_scan.records)


@pytest.mark.skipif(not torch_is("2.13"), reason="figures measured on torch 2.13's yaml")
def test_torch_213_counts(default_scan):
    assert len(default_scan.records) == 3101
    missing = default_scan.by_verdict(MISSING)
    kinds = {}
    for r in missing:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
    assert kinds == {"out": 95, "inplace": 80, "mutable": 2}
    assert {r.name for r in default_scan.by_verdict(UNSUPPORTED)} == {
        "aten::record_stream", "aten::retain_grad", "aten::set_data"}


@pytest.mark.parametrize("op,verdict", [
    ("aten::add.out", COVERED),
    ("aten::add_.Tensor", COVERED),
    ("aten::transpose.int", COVERED),  # a view
    ("aten::split_with_sizes_copy.out", MISSING),
    ("aten::_foreach_zero_", MISSING),
    ("aten::_fused_adam_", MISSING),
    ("aten::_cummax_helper", MISSING),
    ("aten::_amp_foreach_non_finite_check_and_unscale_", MISSING),
    ("aten::set_data", UNSUPPORTED),
    ("aten::__iand__.Scalar", COMPOSITE),
    ("aten::add.Tensor", NOT_MUTATING),
])
def test_bucket_examples(default_scan, op, verdict):
    r = default_scan.get(op)
    assert r is not None and r.verdict == verdict, r


def test_record_carries_yaml_location(default_scan):
    r = default_scan.get("aten::split_with_sizes_copy.out")
    text = open(r.loc.path, encoding="utf-8").read().splitlines()
    assert text[r.loc.line - 1].startswith("- func: split_with_sizes_copy.out(")
    assert [w.name for w in r.written] == ["out"] and r.written[0].form == "tensor_list"


def test_against_runtime_agrees_with_dispatcher(default_scan):
    assert cross_check(default_scan) == []


def test_against_runtime_reports_drift(tmp_path):
    """Another release's yaml, made by editing this one: a changed schema and an op
    this torch lacks are reported; a removed op simply is not scanned."""
    from tests.yaml_fixtures import entries

    native, tags = packaged_yaml()
    text = open(native, encoding="utf-8").read()
    blocks = entries(text)
    text = text.replace(blocks["_cummin_helper"], "")
    text = text.replace("- func: _cummax_helper(Tensor self, Tensor(a!) values, Tensor(b!) indices, int dim)",
                        "- func: _cummax_helper(Tensor self, Tensor(a!) values, Tensor(b!) indices, int dim=0)")
    text += "\n" + blocks["_foreach_zero_"].replace("_foreach_zero", "_foreach_zero2")
    p = tmp_path / "native_functions.yaml"
    p.write_text(text)
    (tmp_path / "tags.yaml").write_text(open(tags).read())
    scan = scan_of(str(p), cache=False)
    assert scan.get("aten::_cummin_helper") is None
    # one missing op removed, two added (_foreach_zero2_ and its autogen out= variant)
    assert len(scan.by_verdict(MISSING)) == len(scan_of().by_verdict(MISSING)) + 1
    drifts = {(d.op, d.kind) for d in cross_check(scan)}
    assert drifts == {("aten::_cummax_helper", "schema"),
                      ("aten::_foreach_zero2_", "absent"),
                      ("aten::_foreach_zero2", "absent"), ("aten::_foreach_zero2.out", "absent")}


def test_cache_is_keyed_by_content(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHGEN_PATCH_CACHE", str(tmp_path / "cache"))
    native, tags = packaged_yaml()
    first = scan_of()
    files = sorted(set(os.listdir(tmp_path / "cache")) - {cache.KEY_FILE})  # the entries' proofs' key aside
    assert len(files) == 1 and files[0].startswith("scan-")
    again = scan_of()
    assert again.records == first.records and again.cpp == first.cpp and again.key == first.key
    # a copy elsewhere has the same content: same cache entry, its own path in the records
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "native_functions.yaml").write_text(open(native).read())
    (tmp_path / "y" / "tags.yaml").write_text(open(tags).read())
    moved = scan_of(str(tmp_path / "y" / "native_functions.yaml"))
    assert len(set(os.listdir(tmp_path / "cache")) - {cache.KEY_FILE}) == 1
    assert moved.records[0].loc.path == str(tmp_path / "y" / "native_functions.yaml")


def test_scan_cli_table_and_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "torchgen_patch", "scan", "--verdict", "unsupported"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["op", "kind", "verdict"]
    assert lines[-1].startswith("total ")
    assert "aten::set_data" in r.stdout


def test_record_json_round_trip_covers_every_field(default_scan):
    from torchgen_patch.scan.model import OpRecord

    r = default_scan.get("aten::split_with_sizes_copy.out")
    assert set(r.to_json()) == set(OpRecord._fields) - {"loc"} | {"file", "line"}
    assert OpRecord.from_json(r.to_json(), r.loc.path) == r
    assert OpRecord.from_row(r.to_row(), r.loc.path) == r
