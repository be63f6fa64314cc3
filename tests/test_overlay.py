"""The overlay is validated strictly, each error at its file:line."""

import pytest

from tests.support import overlay_of
from torchgen_patch.errors import InputError


def load_text(tmp_path, scan, text):
    p = tmp_path / "overlay.yaml"
    p.write_text(text)
    return overlay_of(str(p), scan), str(p)


def error(tmp_path, scan, text) -> str:
    with pytest.raises(InputError) as e:
        load_text(tmp_path, scan, text)
    return e.value.render().replace(str(tmp_path / "overlay.yaml"), "overlay.yaml")


def test_default_overlay_is_valid(default_overlay):
    assert {op for op, e in default_overlay.entries.items() if e.action == "skip"} == {
        "aten::set_data", "aten::retain_grad", "aten::record_stream", "fbgemm::bounds_check_indices",
        "fb::bounds_check_indices"}


def test_runtime_operator_entries_take_only_skip_or_xfail(tmp_path, default_scan):
    o, _ = load_text(tmp_path, default_scan, "mylib::op:\n  action: skip\n  reason: over-declared\n")
    assert o.skipped("mylib::op")
    assert error(tmp_path, default_scan, "mylib::op:\n  template: kernel_always_bump.cpp.j2\n") == (
        "overlay.yaml:1: error: 'mylib::op' is a runtime operator: only 'action: skip' or 'action: xfail' (with a "
        "reason) apply to it (hint: its kernel is the boxed one, not a template)")
    assert error(tmp_path, default_scan, "mylib::op:\n  action: skip\n") == (
        "overlay.yaml:1: error: 'mylib::op': action 'skip' needs a non-empty 'reason'")


def test_valid_entries(tmp_path, default_scan):
    o, _ = load_text(tmp_path, default_scan, """
aten::_cummax_helper:
  action: generate
  template: kernel_always_bump.cpp.j2
aten::_foreach_zero_:
  action: xfail
  reason: some reason
  devices: [cuda]
aten::_cummin_helper:
  action: skip
  reason: not wanted here
""")
    assert o.get("aten::_cummax_helper").template == "kernel_always_bump.cpp.j2"
    assert o.get("aten::_foreach_zero_").devices == ("cuda",)
    assert o.skipped("aten::_cummin_helper") and not o.skipped("aten::_cummax_helper")
    assert o.get("aten::_cummin_helper").line == 9


def test_empty_overlay(tmp_path, default_scan):
    o, _ = load_text(tmp_path, default_scan, "# nothing\n")
    assert o.entries == {}


@pytest.mark.parametrize("text,message", [
    ("aten::_cummax_helper:\n  action: skip\n  reson: typo\n",
     "overlay.yaml:3: error: unknown key 'reson' in entry for 'aten::_cummax_helper' (hint: did you mean 'reason'?)"),
    ("aten::_cummax_helper:\n  action: skip\n  reason: 5\n",
     "overlay.yaml:3: error: 'reason' must be a string"),
    ("aten::_cummax_helper:\n  action: skip\n",
     "overlay.yaml:1: error: 'aten::_cummax_helper': action 'skip' needs a non-empty 'reason'"),
    ("aten::_cummax_helper:\n  action: xfail\n  reason: ''\n",
     "overlay.yaml:1: error: 'aten::_cummax_helper': action 'xfail' needs a non-empty 'reason'"),
    ("aten::split_with_sizes_copy.outt:\n  action: generate\n",
     "overlay.yaml:1: error: unknown operator 'aten::split_with_sizes_copy.outt' "
     "(hint: did you mean 'aten::split_with_sizes_copy.out', 'aten::split_with_sizes_copy', "
     "'aten::split_with_sizes'?)"),
    ("split_with_sizes_copy.out:\n  action: generate\n",
     "overlay.yaml:1: error: unknown operator 'split_with_sizes_copy.out' "
     "(hint: operator names carry their namespace: 'aten::split_with_sizes_copy.out')"),
    ("aten::add.out:\n  action: skip\n  reason: x\n",
     "overlay.yaml:1: error: 'aten::add.out' is covered (the autograd codegen emits an ADInplaceOrView kernel), "
     "not missing: nothing to decide"),
    ("aten::_cummax_helper:\n  action: drop\n",
     "overlay.yaml:2: error: action must be one of generate, skip, xfail, not 'drop'"),
    ("aten::_cummax_helper:\n  action: generate\naten::_cummax_helper:\n  action: generate\n",
     "overlay.yaml:3: error: duplicate entry for 'aten::_cummax_helper' (hint: first at line 1)"),
    ("aten::_cummax_helper:\n  template: kernel.cpp\n",
     "overlay.yaml:2: error: no template 'kernel.cpp' in templates/ (hint: did you mean 'kernel.cpp.j2'?)"),
    ("aten::_cummax_helper:\n  action: skip\n  reason: r\n  devices: [cpu]\n",
     "overlay.yaml:4: error: 'devices' applies to action 'xfail' only"),
    ("aten::_cummax_helper:\n  action: xfail\n  reason: r\n  devices: [tpu]\n",
     "overlay.yaml:4: error: unknown device 'tpu' (hint: allowed: cpu, cuda)"),
    ("aten::_cummax_helper:\n  action: xfail\n  reason: r\n  devices: cuda\n",
     "overlay.yaml:4: error: 'devices' must be a list of strings"),
    ("- aten::_cummax_helper\n",
     "overlay.yaml:1: error: overlay must be a mapping keyed by operator name"),
    ("aten::_cummax_helper: skip\n",
     "overlay.yaml:1: error: entry for 'aten::_cummax_helper' must be a mapping"),
    ("aten::_cummax_helper:\n  action: [skip\n",
     "overlay.yaml:3: error: malformed YAML: expected ',' or ']', but got '<stream end>'"),
    ("aten::_cummax_helper:\n  action: skip\n  action: skip\n  reason: r\n",
     "overlay.yaml:3: error: duplicate key 'action'"),
])
def test_overlay_errors(tmp_path, default_scan, text, message):
    assert error(tmp_path, default_scan, text) == message


def test_overlay_error_through_cli(run_cli, tmp_path):
    p = tmp_path / "o.yaml"
    p.write_text("aten::_cummax_helper:\n  action: skip\n")
    rc, out, err = run_cli("lint", "--overlay", p)
    assert rc == 2 and out == ""
    assert err.strip().endswith("o.yaml:1: error: 'aten::_cummax_helper': action 'skip' needs a non-empty 'reason'")
