"""Issue 4: build, install (cpp and python backends), refusals, faults, CMake."""

import ctypes
import io
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

import torchgen_patch
from tests.conftest import ROOT
from tests.yaml_fixtures import subset_yaml
from tests.support import scan_of
from torchgen_patch.plan.overlay import empty
from torchgen_patch.runtime import compile as build
from torchgen_patch.runtime import install as installer
from torchgen_patch.runtime import load
from torchgen_patch.errors import EnvironmentProblem, InputError
from torchgen_patch.plan import make_plan
from torchgen_patch.codegen.render import render

pytestmark = pytest.mark.build


def repro():
    """The original report's call, plus two ops whose CPU kernels never bump."""
    x = torch.randn(2, 2)
    y, z = torch.empty(2, 1), torch.empty(2, 1)
    torch.split_with_sizes_copy(x, [1, 1], dim=1, out=[y, z])
    v, i = torch.empty(4), torch.empty(4, dtype=torch.long)
    torch.ops.aten._cummax_helper(torch.randn(4), v, i, 0)
    return y._version, z._version, v._version, i._version


def test_install_fixes_the_repro(library):
    assert repro() == (1, 1, 0, 0)
    rep = torchgen_patch.install(library=library.path)
    try:
        assert len(rep.registered) == len(library.ops) and not rep.refused
        assert torchgen_patch.installed_ops() == sorted(library.ops)
        assert repro() == (1, 1, 1, 1)
        again = torchgen_patch.install(library=library.path)  # loading twice is a no-op
        assert again.registered == [] and sorted(again.already) == sorted(library.ops)
        assert repro() == (1, 1, 1, 1)
    finally:
        torchgen_patch.uninstall()
    assert repro() == (1, 1, 0, 0) and torchgen_patch.installed_ops() == []


def test_no_override_warning_and_refusal_of_existing_kernels(library, capfd):
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_cummin_helper", lambda ks, *a: None, "ADInplaceOrView", with_keyset=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rep = torchgen_patch.install(library=library.path)
        assert rep.refused == {"aten::_cummin_helper": "already has an ADInplaceOrView kernel in this torch"}
        assert "aten::_cummax_helper" in rep.registered
    finally:
        torchgen_patch.uninstall()
        lib._destroy()
    assert "Overriding a previously registered kernel" not in capfd.readouterr().err


def test_python_backend_same_semantics():
    rep = torchgen_patch.install(backend="python")
    try:
        assert rep.backend == "python" and not rep.refused
        assert repro() == (1, 1, 1, 1)
    finally:
        torchgen_patch.uninstall()


def _fixture_library(tmp_path, edits=(), funcs=("_cummax_helper", "_cummin_helper", "split_with_sizes_copy",
                                                   "split_with_sizes_copy.out")):
    native, tags = subset_yaml(str(tmp_path), list(funcs), edits)
    plan = make_plan(scan_of(native, tags, cache=False), empty())
    files = render(plan, 1)
    return plan, files


def test_refuses_schema_drift_and_absent_ops(tmp_path):
    """A library made from another yaml: a changed schema and an op this torch lacks."""
    edits = (("_cummax_helper(Tensor self, Tensor(a!) values, Tensor(b!) indices, int dim) -> ()",
              "_cummax_helper(Tensor self, Tensor(a!) values, Tensor(b!) indices, int dim=0) -> ()"),)
    plan, _ = _fixture_library(tmp_path, edits)
    cands = [load.Candidate(k.op, k.schema) for k in plan.kernels]
    cands.append(load.Candidate("aten::_no_such_op", "aten::_no_such_op(Tensor self) -> ()"))
    ok, already, refused = load.check(cands)
    assert refused == {
        "aten::_cummax_helper": "schema differs: the kernel was made for 'aten::_cummax_helper(Tensor self, "
                                "Tensor(a!) values, Tensor(b!) indices, int dim=0) -> ()', this torch has "
                                "'aten::_cummax_helper(Tensor self, Tensor(a!) values, Tensor(b!) indices, "
                                "int dim) -> ()'",
        "aten::_no_such_op": "this torch has no such operator",
    }
    assert [c.op for c in ok] == ["aten::_cummin_helper", "aten::split_with_sizes_copy.out"]


def test_small_build_cache_concurrency_and_torch_mismatch(tmp_path):
    plan, files = _fixture_library(tmp_path)
    root = str(tmp_path / "builds")
    code = (f"import sys; sys.path.insert(0, {ROOT!r});"
            "import json; from torchgen_patch.runtime import compile as build;"
            f"files = {{k: v.encode('latin1') for k, v in json.load(open({str(tmp_path / 'f.json')!r})).items()}};"
            f"lib = build.build(files, [], 1, root={root!r}); print(lib.path)")
    json.dump({k: v.decode("latin1") for k, v in files.items()}, open(tmp_path / "f.json", "w"))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = [p.communicate() + (p.returncode,) for p in procs]
    assert [r[2] for r in results] == [0, 0], results
    paths = {r[0].strip() for r in results}
    assert len(paths) == 1
    built = [r for r in results if "built " in r[1]]
    assert len(built) == 1  # one compiled, the other waited on the lock and found it
    assert sorted(os.listdir(root)) == sorted([os.path.basename(os.path.dirname(paths.pop())),
                                               os.path.basename(os.path.dirname(built[0][0].strip())) + ".lock"])
    # a second build with nothing changed compiles nothing
    lib = build.build(files, [], 1, root=root)
    assert lib.built is False
    # a torch upgrade between build and load: refused, nothing registered
    info = os.path.join(lib.directory, "build-info.json")
    data = json.load(open(info))
    data["torch"] = "0.0.1"
    json.dump(data, open(info, "w"))
    with pytest.raises(InputError) as e:
        installer.install(library=lib.path)
    assert e.value.render() == (f"{lib.path}: error: built for torch 0.0.1, this is torch {torch.__version__} "
                                "(hint: rebuild with `torchgen-patch build`)")
    assert torchgen_patch.installed_ops() == []


def test_compiler_errors_name_the_op(tmp_path):
    plan, files = _fixture_library(tmp_path)
    name = "ADInplaceOrViewPatch_0.cpp"
    text = files[name].decode()
    marker = "torchgen_patch::bump_if_unchanged(values, values_before);"
    i = text.index("// aten::_cummin_helper")
    files[name] = (text[:i] + text[i:].replace(marker, marker + " int broken = ;", 1)).encode()
    root = tmp_path / "builds"
    with pytest.raises(InputError) as e:
        build.build(files, [], 1, root=str(root))
    msg = e.value.render()
    assert msg.startswith("torchgen-patch: error: the generated kernels do not compile:\n")
    line = next(k.line for k in plan.kernels if k.op == "aten::_cummin_helper")  # its line in the fixture yaml
    assert f"[in the kernel of aten::_cummin_helper (native_functions.yaml:{line})]" in msg
    # nothing half-built is left where a later load would look
    assert [p for p in os.listdir(root) if p.startswith("build-") and not p.endswith(".lock")] == []


def test_no_compiler(tmp_path, monkeypatch):
    plan, files = _fixture_library(tmp_path)
    monkeypatch.setenv("CXX", "no-such-compiler-xyz")
    with pytest.raises(EnvironmentProblem) as e:  # what the machine lacks: exit 3, no bad input
        build.build(files, [], 1, root=str(tmp_path / "b"))
    assert e.value.render() == ("torchgen-patch: error: no C++ compiler: 'no-such-compiler-xyz' is not on PATH "
                                "(hint: install g++ (or set CXX), or use --backend python (install(backend='python') "
                                "in "
                                "Python))")


def test_no_ninja(tmp_path, monkeypatch):
    plan, files = _fixture_library(tmp_path)
    real = shutil.which
    monkeypatch.setattr(shutil, "which", lambda cmd, *a, **k: None if cmd == "ninja" else real(cmd, *a, **k))
    with pytest.raises(EnvironmentProblem) as e:  # what the machine lacks: exit 3, no bad input
        build.build(files, [], 1, root=str(tmp_path / "b"))
    assert e.value.render() == ("torchgen-patch: error: ninja is not installed (the kernels are built with it) "
                                "(hint: pip install ninja)")
    assert [p for p in os.listdir(tmp_path / "b") if p.startswith(".build-")] == []


def test_unwritable_build_directory(tmp_path):
    plan, files = _fixture_library(tmp_path)
    with pytest.raises(InputError) as e:
        build.build(files, [], 1, root="/proc/torchgen-patch-builds")
    assert e.value.render().startswith("/proc/torchgen-patch-builds: error: build directory is not writable: ")


def test_build_cli_cache_hit(run_cli, library):
    rc, out, err = run_cli("build")
    assert rc == 0 and out.strip() == library.path
    assert "up to date (cache hit)" in err


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_cmake_route_builds_the_same_library(tmp_path, library):
    build_dir = tmp_path / "cmake-build"
    env = dict(os.environ, PYTHONPATH=ROOT)
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    cfg = subprocess.run(["cmake", *gen, "-S", os.path.join(ROOT, "tests", "cmake_project"), "-B", str(build_dir),
                          f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", "-DCMAKE_BUILD_TYPE=Release",
                          f"-DTORCHGEN_PATCH_COMMAND={sys.executable};-m;torchgen_patch"],
                         capture_output=True, text=True, env=env)
    if cfg.returncode != 0 and torch.version.cuda and "Could NOT find CUDA" in cfg.stdout + cfg.stderr:
        pytest.skip(f"this torch is a CUDA {torch.version.cuda} build: its CMake config needs a CUDA toolkit, "
                    "and CMake found none here")
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    b = subprocess.run(["cmake", "--build", str(build_dir), "-j2"], capture_output=True, text=True, env=env)
    assert b.returncode == 0, b.stdout + b.stderr
    so = build_dir / "libversion_counter_patch.so"
    # built with REGISTER_AT_LOAD: loading it registers every kernel, so it is
    # only ever loaded in a fresh process, never in this one
    code = ("import torch, sys, ctypes; sys.path.insert(0, %r); from tests.test_build import repro;"
            "print(repro()); torch.ops.load_library(%r); print(repro());"
            "dll = ctypes.CDLL(%r); dll.torchgen_patch_count.restype = ctypes.c_int64;"
            "dll.torchgen_patch_name.restype = ctypes.c_char_p;"
            "print(','.join(sorted(dll.torchgen_patch_name(i).decode() for i in range(dll.torchgen_patch_count()))))"
            ) % (ROOT, str(so), str(so))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[:2] == ["(1, 1, 0, 0)", "(1, 1, 1, 1)"]
    assert "Overriding" not in r.stderr
    # the CMake library carries the same kernels as the cpp_extension build
    dll = ctypes.CDLL(library.path)  # registers nothing at load
    dll.torchgen_patch_count.restype = ctypes.c_int64
    dll.torchgen_patch_name.restype = ctypes.c_char_p
    ours = sorted(dll.torchgen_patch_name(i).decode() for i in range(dll.torchgen_patch_count()))
    assert lines[2].split(",") == ours and len(ours) == len(library.ops)
    # a re-build with nothing changed regenerates and recompiles nothing
    again = subprocess.run(["cmake", "--build", str(build_dir)], capture_output=True, text=True, env=env)
    assert "no work to do" in again.stdout or "Linking" not in again.stdout


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_first_build_says_each_unit_with_its_own_time_and_the_next_an_estimate(tmp_path, monkeypatch):
    """On a terminal: a line per translation unit with its own compile time (not the time since the
    start), plurals right; no estimate before anything was built here (none could be honest), and
    after one build an estimate made from that build's units."""
    from torchgen_patch.runtime.compile import build_boxed
    from torchgen_patch.runtime.compile.build_time import estimate

    monkeypatch.delenv("CI", raising=False)
    log = _Terminal()
    build_boxed(root=str(tmp_path), log=log)
    lines = log.getvalue().splitlines()
    assert lines[0] == f"torchgen-patch: compiling 2 translation units with ninja (torch {torch.__version__}) ..."
    units = sorted(lines[1:3], key=lambda line: line.split("compiled ")[-1])
    assert re.fullmatch(r"torchgen-patch: \[\d/2\] compiled BoxedADInplaceOrView\.cpp in \d+ s", units[0]), lines
    assert re.fullmatch(r"torchgen-patch: \[\d/2\] compiled torchgen_patch_build\.cpp in \d+ s", units[1]), lines
    assert lines[3].startswith("torchgen-patch: built ") and len(lines) == 4
    record = json.load(open(os.path.join(os.path.dirname(build_boxed(root=str(tmp_path)).path), build.RECORD)))
    said = {u: t["seconds"] for u, t in record["unit_times"].items()}
    assert said["BoxedADInplaceOrView.cpp"] > said["torchgen_patch_build.cpp"] >= 0
    estimating = importlib.import_module("torchgen_patch.runtime.compile.build_time")  # the module, not its function

    monkeypatch.setattr(estimating, "load_now", lambda: record["load"])  # as busy as during that build
    guess = estimate(str(tmp_path),
                     {"BoxedADInplaceOrView.cpp": record["unit_times"]["BoxedADInplaceOrView.cpp"]["bytes"]})
    m = re.fullmatch(r"about (\d+) s, going by 1 earlier build here", guess)
    assert m and int(m.group(1)) <= round(record["seconds"]) + 1, (guess, record)
    assert estimate(str(tmp_path / "elsewhere"), {"a.cpp": 1}) is None


def test_build_progress_is_for_terminals_only(tmp_path, monkeypatch):
    from torchgen_patch.fs.dirs import open_dir
    from torchgen_patch.runtime.compile.progress import Progress

    (tmp_path / ".ninja_log").write_text("# ninja log v5\n0\t1000\t0\ta.o\t0\n")
    with open_dir(str(tmp_path)) as d:
        log = io.StringIO()  # a pipe or a file: CI logs get the start and end lines only
        with Progress(d, ["src/a.cpp"], log):
            pass
        assert log.getvalue() == ""
        on = _Terminal()
        monkeypatch.delenv("CI", raising=False)
        with Progress(d, ["src/a.cpp"], on):
            pass
        assert on.getvalue() == "torchgen-patch: [1/1] compiled a.cpp in 1 s\n"
        monkeypatch.setenv("CI", "1")
        assert not Progress(d, ["src/a.cpp"], _Terminal()).on


def test_a_build_says_what_it_does_on_the_stderr_of_its_call(tmp_path, capsys):
    """The log is ``sys.stderr`` as it is when the build runs: one bound when the module was first
    imported (under a test's capture, a ``redirect_stderr``) may be closed by then."""
    with pytest.raises(InputError, match="the generated kernels do not compile"):
        build.build({"stop.cpp": b"#error stop here\n"}, [], 0, root=str(tmp_path), sources=["stop.cpp"])
    # the source given and the unit that makes a library state its own build
    assert "torchgen-patch: compiling 2 translation units with ninja" in capsys.readouterr().err


def test_the_estimate_grows_with_how_busy_the_machine_is_now_against_then(tmp_path, monkeypatch):
    """An earlier build of 2 units on 2 workers, 2 processors idle, 10 s a unit: alone again, about 10 s;
    beside 6 other runnable processes, each worker gets a quarter of a processor: about 40 s (the
    estimate ran at half the real time and less on a loaded machine)."""
    estimating = importlib.import_module("torchgen_patch.runtime.compile.build_time")  # the module, not its function

    d = tmp_path / "build-0123"
    d.mkdir()
    (d / build.RECORD).write_text(json.dumps({
        "unit_times": {"a.cpp": {"bytes": 100, "seconds": 10.0}, "b.cpp": {"bytes": 100, "seconds": 10.0}},
        "jobs": 2, "units": 2, "load": 0.0, "cpus": 2}))
    monkeypatch.setattr(estimating.os, "cpu_count", lambda: 2)
    units = {"a.cpp": 100, "b.cpp": 100}
    monkeypatch.setattr(estimating, "load_now", lambda: 0.0)
    assert estimating.estimate(str(tmp_path), units) == "about 10 s, going by 1 earlier build here"
    monkeypatch.setattr(estimating, "load_now", lambda: 6.0)
    assert estimating.estimate(str(tmp_path), units) == "about 40 s, going by 1 earlier build here"
