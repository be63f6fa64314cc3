"""The codegen step: goldens, write-if-changed, shards, dependencies, strict
mode, determinism."""

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.support import torch_is
from tests.regen_goldens import GOLDEN, render_goldens
from torchgen_patch.plan import make_plan
from torchgen_patch.codegen.render import environment, render


@pytest.mark.skipif(not torch_is("2.13"), reason="goldens are made from torch 2.13's yaml entries")
def test_goldens_are_current():
    """Fails when tests/golden is stale: run `make goldens` and review the diff."""
    files = render_goldens()
    on_disk = {}
    for dirpath, _, names in os.walk(GOLDEN):
        for n in names:
            p = os.path.join(dirpath, n)
            on_disk[os.path.relpath(p, GOLDEN)] = open(p, "rb").read()
    assert sorted(on_disk) == sorted(files)
    for name in files:
        assert on_disk[name] == files[name], f"stale golden: {name} (run `make goldens`)"


def test_goldens_cover_each_family():
    names = set(os.listdir(os.path.join(GOLDEN, "kernels")))
    assert {"split_with_sizes_copy.out.cpp", "_foreach_add.Scalar_out.cpp", "_foreach_add_.Scalar.cpp",
            "_fused_adam_.cpp", "_cummax_helper.cpp", "_cummin_helper.cpp"} <= names
    opt = open(os.path.join(GOLDEN, "kernels", "_cummin_helper.cpp")).read()
    # the synthetic optional written argument: torchgen passes it as at::Tensor& (undefined for None)
    assert "at::Tensor & indices" in opt and "bump_if_unchanged(indices, indices_before)" in opt


def _gen(run_cli, out, *extra):
    rc, stdout, err = run_cli("gen", "--out", out, *extra)
    assert rc == 0, err
    return stdout  # the summary: gen's result goes to files, its summary to stdout


def test_write_if_changed_keeps_mtimes(run_cli, tmp_path):
    out = tmp_path / "g"
    err = _gen(run_cli, out)
    assert "6 of 6 files written" in err
    mtimes = {p: os.stat(out / p).st_mtime_ns for p in os.listdir(out)}
    os.utime(out / "ADInplaceOrViewPatch_0.cpp", ns=(1, 1))  # make any rewrite visible
    mtimes["ADInplaceOrViewPatch_0.cpp"] = 1
    err = _gen(run_cli, out)
    assert "0 of 6 files written" in err
    assert {p: os.stat(out / p).st_mtime_ns for p in os.listdir(out)} == mtimes


def test_only_changed_files_are_rewritten(run_cli, tmp_path):
    out = tmp_path / "g"
    _gen(run_cli, out)
    ov = tmp_path / "o.yaml"
    ov.write_text("aten::_cummax_helper:\n  template: kernel_always_bump.cpp.j2\n")
    err = _gen(run_cli, out, "--overlay", ov)
    # the kernel's shard, the Everything file and the manifest change; nothing else
    assert "3 of 6 files written" in err
    text = (out / "ADInplaceOrViewPatchEverything.cpp").read_text()
    body = text[text.index("// aten::_cummax_helper "):]
    assert "torchgen_patch::bump(values);" in body.split("\n}\n", 1)[0]


def test_shards_are_stable(default_scan, default_overlay):
    """An op's shard depends on its name only: removing other ops never moves it."""
    plan = make_plan(default_scan, default_overlay)
    full = {k.op: k.shard(3) for k in plan.kernels}
    assert set(full.values()) == {0, 1, 2}
    files = render(plan, 3)
    for k in plan.kernels:
        assert f"\n// {k.op}  (" in files[f"ADInplaceOrViewPatch_{full[k.op]}.cpp"].decode()
    from torchgen_patch.plan import Plan

    half = Plan(kernels=plan.kernels[::2], left_out=(), torch_version=plan.torch_version)
    files_half = render(half, 3)
    for k in half.kernels:
        assert f"\n// {k.op}  (" in files_half[f"ADInplaceOrViewPatch_{full[k.op]}.cpp"].decode()
    for k in plan.kernels[1::2]:
        assert all(f"\n// {k.op}  (" not in files_half[n].decode() for n in files_half if n.endswith(".cpp"))


def test_stable_hash_is_sha1_based():
    import hashlib

    from torchgen_patch.plan import stable_hash

    key = "aten::split_with_sizes_copy.out"
    assert stable_hash(key) == int.from_bytes(hashlib.sha1(key.encode()).digest()[:8], "little")


def test_output_dependencies_dry_run(run_cli, tmp_path):
    dep = tmp_path / "deps.cmake"
    out = tmp_path / "g"
    rc, _, _ = run_cli("gen", "--out", out, "--shards", "3", "--output-dependencies", dep, "--dry-run")
    assert rc == 0 and not out.exists()
    text = dep.read_text()
    srcs = re.search(r"set\(TORCHGEN_PATCH_SOURCES\n(.*?)\)", text, re.S).group(1).split()
    assert srcs == [f'"{out}/{n}"' for n in ["ADInplaceOrViewPatch_0.cpp", "ADInplaceOrViewPatch_1.cpp",
                                             "ADInplaceOrViewPatch_2.cpp", "RegisterADInplaceOrViewPatch.cpp"]]
    outs = re.search(r"set\(TORCHGEN_PATCH_OUTPUTS\n(.*?)\)", text, re.S).group(1).split()
    assert len(outs) == 7 and outs == sorted(outs)
    # a real run writes exactly the listed outputs
    _gen(run_cli, out, "--shards", "3")
    assert sorted(f'"{out}/{n}"' for n in os.listdir(out)) == outs


def test_output_dependencies_directory_is_created(run_cli, tmp_path):
    dep = tmp_path / "new" / "dir" / "deps.cmake"
    rc, _, _ = run_cli("gen", "--out", tmp_path / "g", "--output-dependencies", dep, "--dry-run")
    assert rc == 0 and dep.read_text().startswith("set(TORCHGEN_PATCH_SOURCES\n")


def test_strict_mode_names_the_op(run_cli, tmp_path, default_scan):
    out = tmp_path / "g"
    rc, stdout, err = run_cli("gen", "--out", out, "--strict", "--no-overlay")
    r = default_scan.get("aten::record_stream")
    assert rc == 2 and not out.exists()
    from torchgen_patch.errors import display_path

    assert err == (f"{display_path(r.loc.path)}:{r.loc.line}: error: aten::record_stream: cannot generate a kernel: "
                   f"{r.reason} (hint: add a 'skip' entry with a reason to the overlay)\n")


def test_without_strict_unsupported_ops_are_listed(run_cli, tmp_path):
    rc, out, err = run_cli("gen", "--out", tmp_path / "g", "--no-overlay")
    assert rc == 0
    left = [line for line in err.splitlines() if line.startswith("left out: ")]  # notes, on stderr
    assert [line.split(":")[1].strip() for line in left] == ["aten", "aten", "aten"]
    assert "3 left out" in out  # the summary, on stdout
    # a re-run on a current output repeats only the count; -v names them again
    rc, out, err = run_cli("gen", "--out", tmp_path / "g", "--no-overlay")
    assert rc == 0 and "3 left out; 0 of " in out and "left out: " not in err, err
    rc, out, err = run_cli("gen", "--out", tmp_path / "g", "--no-overlay", "-v")
    assert [line for line in err.splitlines() if line.startswith("left out: ")] == left


def test_deterministic_across_hash_seeds_and_cwd(tmp_path):
    outs = []
    for seed, cwd in (("0", ROOT), ("12345", str(tmp_path))):
        out = tmp_path / f"g{seed}"
        env = dict(os.environ, PYTHONHASHSEED=seed, LC_ALL="C", PYTHONPATH=ROOT)
        r = subprocess.run([sys.executable, "-m", "torchgen_patch", "gen", "--out", str(out), "--no-cache"],
                           env=env, cwd=cwd, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        outs.append({p: (out / p).read_bytes() for p in sorted(os.listdir(out))})
    assert outs[0] == outs[1]
    for name, data in outs[0].items():
        assert str(tmp_path).encode() not in data and ROOT.encode() not in data, name
        assert not re.search(rb"20\d\d-\d\d-\d\d", data), f"timestamp in {name}"


def test_output_sorted_and_generated_header(default_plan):
    files = render(default_plan, 2)
    for name, data in files.items():
        if name.endswith((".cpp", ".h")):
            assert data.startswith(b"// @generated by torchgen-patch from templates/"), name
    ev = files["ADInplaceOrViewPatchEverything.cpp"].decode()
    ops = re.findall(r"^// (aten::\S+)  \(", ev, re.M)
    assert ops == sorted(ops) and len(ops) == len(default_plan.kernels)


def test_templates_use_strict_undefined():
    import jinja2

    with pytest.raises(jinja2.UndefinedError):
        environment().from_string("{{ nope }}").render()


def test_the_kernel_templates_branch_only_on_the_plans_refusal():
    """Templates arrange text; Python decides (docs/design.md): the one ``{% if %}`` of each kernel
    template tests ``k.refuse_name``, the requires-grad refusal the plan chose, never an op name."""
    from jinja2 import nodes

    from torchgen_patch.codegen.render import templates_dir

    env = environment()
    kernels = sorted(n for n in os.listdir(templates_dir()) if n.startswith("kernel") and n.endswith(".j2"))
    assert kernels == ["kernel.cpp.j2", "kernel_always_bump.cpp.j2"]
    for name in kernels:
        tree = env.parse(env.loader.get_source(env, name)[0])
        tests = [ifs.test for ifs in tree.find_all(nodes.If)]
        assert [(type(t).__name__, getattr(t, "attr", None), getattr(getattr(t, "node", None), "name", None))
                for t in tests] == [("Getattr", "refuse_name", "k")], name


def test_includes_only_what_is_needed(default_plan):
    files = render(default_plan, 2)
    for name in ("ADInplaceOrViewPatch_0.cpp", "ADInplaceOrViewPatch_1.cpp", "RegisterADInplaceOrViewPatch.cpp",
                 "TorchgenPatchRuntime.h"):
        text = files[name].decode()
        assert "torch/extension.h" not in text and "ATen/ATen.h" not in text, name
    headers = re.findall(r"#include <ATen/ops/(\w+)_ops.h>", files["ADInplaceOrViewPatch_0.cpp"].decode())
    assert headers == sorted(set(headers))
    assert set(headers) == {k.root_name for k in default_plan.kernels if k.shard(2) == 0}


def test_full_set_compiles_with_werror(library, default_plan):
    """The build fixture compiles every generated file with -Wall -Werror (the tests' flag);
    a user's build has -Wall but never -Werror."""
    import ctypes
    import json

    from torchgen_patch.runtime.compile import CFLAGS

    assert "-Wall" in CFLAGS and "-Werror" not in CFLAGS
    with open(os.path.join(library.directory, "build-info.json")) as fh:
        flags = json.load(fh)["flags"]
    assert "-Werror" in flags and "-Wall" in flags
    dll = ctypes.CDLL(library.path)
    dll.torchgen_patch_count.restype = ctypes.c_int64
    assert dll.torchgen_patch_count() == len(default_plan.kernels)


def test_fewer_shards_remove_the_old_ones_and_lint_reports_leftovers(run_cli, tmp_path):
    """gen removes the files of its own earlier run that this run no longer makes (known from
    its manifest; never a file it did not write); lint --generated reports a left-over shard."""
    out = tmp_path / "g"
    assert run_cli("gen", "--out", out, "--shards", "5")[0] == 0
    (out / "mine.txt").write_text("not gen's")
    assert run_cli("gen", "--out", out, "--shards", "2")[0] == 0
    assert sorted(os.listdir(out)) == sorted(["ADInplaceOrViewPatchEverything.cpp", "ADInplaceOrViewPatch_0.cpp",
                                              "ADInplaceOrViewPatch_1.cpp", "RegisterADInplaceOrViewPatch.cpp",
                                              "TorchgenPatchRuntime.h", "torchgen_patch_manifest.json", "mine.txt"])
    (out / "ADInplaceOrViewPatch_4.cpp").write_text("// left over\n")  # as an older tool would leave it
    rc, text, _ = run_cli("lint", "--generated", out)
    assert rc == 1 and "error: [VERSIONCOUNTER] ADInplaceOrViewPatch_4.cpp: not one of the 2 shard(s)" in text


def test_leftovers_of_older_runs_go_only_when_gen_wrote_them(run_cli, tmp_path):
    out = tmp_path / "g"
    assert run_cli("gen", "--out", out, "--shards", "2")[0] == 0
    head = (out / "ADInplaceOrViewPatch_0.cpp").read_text().splitlines()[0]
    (out / "ADInplaceOrViewPatch_7.cpp").write_text(head + "\n// an older run's shard\n")
    (out / "ADInplaceOrViewPatch_8.cpp").write_text("// someone else's file\n")
    assert run_cli("gen", "--out", out, "--shards", "2")[0] == 0
    assert not (out / "ADInplaceOrViewPatch_7.cpp").exists() and (out / "ADInplaceOrViewPatch_8.cpp").exists()
    manifest = out / "torchgen_patch_manifest.json"
    manifest.write_text(manifest.read_text().replace('"shards": 2', '"shards": 1e400'))
    rc, _, err = run_cli("lint", "--generated", out)
    assert rc == 2 and "not a torchgen-patch output directory" in err
