"""The checkout world on PyTorch's real source tree (Debian's source package `pytorch`, fetched with apt
into .cache/pytorch-src/ by testbed/debian_source.py; skipped with the reason when it cannot be had), in a
venv without torch; and the release check's report (scripts/release_check/): its rendering, its
verdicts and the docs' table generated from it. PyTorch's own test files are the release check's, not CI's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
import testbed.release_inputs as ri
from testbed.debian_source import fetch_tarball, mirror, release_of, tree_from_tarball

sys.path.insert(0, os.path.join(ROOT, "scripts"))  # the release check (scripts/release_check/) and stack_dump
import stack_dump as sd  # noqa: E402
from release_check import adapters, checkout, config, groups, ranks, report, runner, verdicts  # noqa: E402

REPORT = os.path.join(ROOT, "reports", "pytorch-own-2.6.0.json")


@pytest.fixture(scope="module")
def tarball():
    found, why = fetch_tarball(config.CACHE, timeout=180)  # a mirror that hangs costs CI minutes, not an hour
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
                             ["torchgen", "tools", "aten/src/ATen", "version.txt", ".lintrunner.toml", "pytest.ini"])
    row = checkout.step_checkout(tree, str(tmp_path), release)
    assert "failed" not in row, row
    matrix = json.load(open(os.path.join(ROOT, "reports", "compat-matrix.json")))["releases"][release]
    assert row["counts"] == matrix["counts"] and row["total"] == matrix["total"], (row, matrix)
    assert row["matrix_row_same"]
    assert row["upstream_added_are_the_missing"]
    assert row["upstream_after"] - row["upstream_before"] == row["counts"]["missing"] == row["gen_kernels"]
    assert row["patched_findings"] == 0
    assert row["lintrunner_halves"] == "both"  # the block checks the requires-grad half too
    assert (row["lintrunner_before"], row["lintrunner_after"]) == (checkout.lintrunner_expected(row), 0)
    assert checkout.lintrunner_expected(row) > row["findings"] > 0
    assert row["requires_grad_checks_removed"] == []
    assert row["requires_grad_checks_added_are_the_lint_ops"] and row["requires_grad_checks_added_ops"] > 0
    assert "tools/autograd/gen_inplace_or_view_type.py" in row["fix_edits"]
    # the tree's own tools/test/test_codegen.py (its pytest.ini) with the fix's cases: fail unpatched, pass fixed
    assert "tools/test/test_codegen.py" in row["fix_edits"]
    cases = row["codegen_tests"]["cases"]
    assert {t for t, (before, _) in cases.items() if before == "failed"} == {
        f"TestGenInplaceOrViewType.test_{t}" for t in ("out_with_no_returns", "foreach_inplace", "fused_inplace")}
    assert checkout.codegen_tests_pass(row["codegen_tests"]) and row["codegen_tests"]["others_before"]["passed"] > 10
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
    lint_config = {"linter": [
        {"code": "ALLPY", "include_patterns": ["**/*.py"]},
        {"code": "TESTS", "include_patterns": ["test/**/test_*.py"], "exclude_patterns": ["test/run_test.py"]},
        {"code": "TOOLS", "include_patterns": ["tools/**"], "exclude_patterns": ["tools/autograd/*.py"]},
        {"code": "YAML", "include_patterns": ["aten/src/ATen/native/*.yaml"]}]}
    files = ["tools/autograd/gen_inplace_or_view_type.py", "test/test_autograd_inplace_or_view.py"]
    assert adapters.linters_for(lint_config, files) == {"ALLPY": files, "TESTS": [files[1]]}


_CASE = {"passed": "", "failed": "<failure message='x'/>", "skipped": "<skipped/>", "error": "<error/>"}


def test_outcomes_are_read_test_by_test_and_a_difference_needs_a_verdict(tmp_path, monkeypatch):
    xml = tmp_path / "r.xml"
    cases = [("test_x.TestA", "test_1", "passed"), ("test_x.TestA", "test_2", "failed"),
             ("test_x.TestB", "test_1", "skipped"), ("test_x.TestB", "test_3", "error")]
    xml.write_text("<testsuites><testsuite>" + "".join(
        f"<testcase classname='{c}' name='{n}'>{_CASE[o]}</testcase>" for c, n, o in cases)
        + "</testsuite></testsuites>")
    assert runner._junit(str(xml)) == {f"{c}.{n}": o for c, n, o in cases}
    assert runner._junit(str(tmp_path / "absent.xml")) == {}
    data = json.load(open(REPORT))
    group = next(iter(config.TEST_GROUPS))
    data["tests"][group] = dict(data["tests"].get(group) or {"unpatched": {}, "patched": {}},
                                differ=[{"test": "test_x.TestA.test_2", "unpatched": "passed", "patched": "failed"}])
    assert f"{group}: test_x.TestA.test_2: unjudged" in verdicts.defects(data)
    monkeypatch.setitem(config.VERDICTS, "test_x.TestA.test_2", ("intended", "asserted the old counter"))
    assert not [d for d in verdicts.defects(data) if "test_x" in d]
    monkeypatch.setitem(config.VERDICTS, "test_x.TestA.test_2", ("defect", "a launcher bug"))
    assert f"{group}: test_x.TestA.test_2: defect" in verdicts.defects(data)
    # passing every time when run alone again is no verdict: the failure may be this project's
    monkeypatch.delitem(config.VERDICTS, "test_x.TestA.test_2")
    d = data["tests"][group]["differ"][0]
    d["reruns"] = {"unpatched": [{"outcome": "passed"}] * config.RERUNS,
                   "patched": [{"outcome": "passed"}] * config.RERUNS}
    assert f"{group}: test_x.TestA.test_2: unjudged" in verdicts.defects(data)


def test_report_and_docs_table_are_rendered_from_the_json():
    data = json.load(open(REPORT))
    with open(REPORT[:-len(".json")] + ".md", encoding="utf-8") as f:
        assert f.read() == report.report_md(data), "stale: run `python scripts/pytorch_check.py --render-only --report`"
    for doc in config.DOCS:
        with open(doc, encoding="utf-8") as f:
            assert report.doc_block(f.read()) == report.results_table(data), f"{doc}'s table differs from the report"


def _source_package(d, monkeypatch, release="2.6.0", pin=True) -> str:
    """A small source package as apt-get source leaves it: an upstream tarball and a .dsc pinning it, the
    .dsc pinned for the test (testbed.release_inputs.PINNED_DSC)."""
    import hashlib

    top = d / f"pytorch-{release}"
    top.mkdir(parents=True)
    (top / "version.txt").write_text(f"{release}\n")
    tar = d / f"pytorch_{release}+dfsg.orig.tar.xz"
    subprocess.run(["tar", "-cJf", str(tar), "-C", str(d), top.name], check=True)
    data = tar.read_bytes()
    if pin:
        dsc = (f"Format: 3.0 (quilt)\nSource: pytorch\nChecksums-Sha256:\n {hashlib.sha256(data).hexdigest()} "
               f"{len(data)} {tar.name}\nFiles:\n 0 1 x\n").encode()
        (d / f"pytorch_{release}+dfsg-7.dsc").write_bytes(dsc)
        monkeypatch.setitem(ri.PINNED_DSC, f"pytorch_{release}+dfsg-7.dsc", (hashlib.sha256(dsc).hexdigest(), len(dsc)))
    return str(tar)


def test_without_a_cached_tarball_or_apt_the_reason_is_given(tmp_path, monkeypatch):
    cached = _source_package(tmp_path / "cache" / "src", monkeypatch)
    os.rename(tmp_path / "cache", tmp_path / "later")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert fetch_tarball(str(tmp_path / "cache")) == (None, "no apt-get on this machine")
    os.rename(tmp_path / "later", tmp_path / "cache")
    assert fetch_tarball(str(tmp_path / "cache")) == (cached, "")  # a cached one needs no apt
    assert release_of(cached) == "2.6.0"


def test_a_cached_tarball_is_used_only_with_the_sha256_its_dsc_pins(tmp_path, monkeypatch):
    """Every cached copy is checked at every use, and the tree is unpacked from the bytes checked: the
    newest name no longer wins, a copy no .dsc pins or whose bytes differ is never used."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty") + os.pathsep + "/usr/bin:/bin")  # tar, no apt-get
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: None if name == "apt-get" else f"/usr/bin/{name}")
    src = tmp_path / "cache" / "src"
    good = _source_package(src, monkeypatch)
    _source_package(src, monkeypatch, "9.9.9", pin=False)  # newer by name, pinned by nothing
    assert fetch_tarball(str(tmp_path / "cache")) == (good, "")
    tree = tree_from_tarball(good, str(tmp_path / "tree"), git=False)
    assert open(os.path.join(tree, "version.txt")).read() == "2.6.0\n"
    with open(good, "ab") as fh:
        fh.write(b"\0")
    found, why = fetch_tarball(str(tmp_path / "cache"))
    assert found is None and f"{good} is {os.path.getsize(good)} bytes, not the" in why, why
    with pytest.raises(ValueError, match="not unpacking"):
        tree_from_tarball(good, str(tmp_path / "tree2"), git=False)
    assert not os.path.exists(tmp_path / "tree2" / "version.txt")


def _fake_apt(tmp_path, monkeypatch, source: str) -> str:
    """apt-get on PATH as a script that logs its arguments and, for `source`, the owner of the directory it
    downloads into, then runs ``source`` (shell) there; returns the log's path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    (bin_dir / "apt-get").write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n"
                                     f"case \" $* \" in *\" source \"*) stat -c 'owner %U' . >> {log}; {source};; "
                                     f"esac\n")
    (bin_dir / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return str(log)


def test_apt_keeps_its_privilege_drop_and_what_it_fetched_is_checked(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    _source_package(pkg, monkeypatch)
    log = _fake_apt(tmp_path, monkeypatch, f"cp {pkg}/pytorch_* .")
    found, why = fetch_tarball(str(tmp_path / "cache"))
    assert found == str(tmp_path / "cache" / "src" / "pytorch_2.6.0+dfsg.orig.tar.xz"), why
    said = open(log).read()
    assert "Sandbox" not in said, said  # apt's own default: as root, downloads run as _apt
    if os.geteuid() == 0 and os.system("id _apt >/dev/null 2>&1") == 0:
        assert "owner _apt" in said, said  # and the directory it downloads into is _apt's
    # apt saying it downloaded as root after all, or a tarball other than the .dsc pins: not used
    monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])
    (tmp_path / "bin").rename(tmp_path / "old-bin")
    _fake_apt(tmp_path, monkeypatch, "echo \"W: Download is performed unsandboxed as root as file 'x'\" >&2; "
              f"cp {pkg}/pytorch_* .")
    found, why = fetch_tarball(str(tmp_path / "other-cache"))
    assert found is None and why.startswith("apt-get source could not drop its privileges: W: Download is "
                                            "performed unsandboxed"), why
    monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])
    (tmp_path / "bin").rename(tmp_path / "old-bin2")
    _fake_apt(tmp_path, monkeypatch, f"cp {pkg}/pytorch_* .; echo x >> pytorch_2.6.0+dfsg.orig.tar.xz")
    found, why = fetch_tarball(str(tmp_path / "third-cache"))
    assert found is None and why.startswith("apt-get source fetched nothing a pin vouches for: ") and \
        "pytorch_2.6.0+dfsg.orig.tar.xz is" in why, why
    assert not os.path.exists(tmp_path / "third-cache" / "src" / "pytorch_2.6.0+dfsg.orig.tar.xz")


# A rank of PyTorch 2.6's DTensor tests stuck at the end of a test (py-spy dump --native --locals, the paths of
# its first lines shortened): the process group's destructor joining gloo's workers with the GIL held while a
# worker waits for the GIL
STUCK = os.path.join(ROOT, "tests", "data", "stuck-rank-torch2.6.0.txt")
TEST = "test.distributed._tensor.test_optimizers.TestDTensorOptimizer.test_adamw_1d_sharding"
TIMEOUT = ("failed", "RuntimeError: Process 2 terminated or timed out after 125.1 seconds")


def test_a_stuck_rank_is_read_from_its_stacks():
    dump = open(STUCK).read()
    assert sd.read_stuck(dump) == {"test": "TestDTensorOptimizer.test_adamw_1d_sharding",
                                   "gloo_teardown_deadlock": True, "ours": False}
    # a frame of this project's kernels on any thread: not PyTorch's own hang
    ours = dump.replace("c10::TensorImpl::~TensorImpl (libc10.so)",
                        "at::(anonymous namespace)::kernel (torchgen_patch_kernels_0123456789ab.so)", 1)
    assert ours != dump and sd.read_stuck(ours)["ours"]
    # the destructor waiting without a worker waiting for the GIL is another hang
    alone = "".join(t for t in sd.thread_texts(dump) if "gil_scoped_acquire" not in t)
    assert not sd.read_stuck("x\n" + alone)["gloo_teardown_deadlock"]
    excerpt = sd.deadlock_excerpt(dump)
    assert "std::_Hashtable<…>::clear (libtorch_cpu.so)" in excerpt and "0x7f" not in excerpt
    assert "with_comms.<locals>.decorator" in excerpt  # Python frames keep their names


# A rank stuck in a wait of its own, with a local string that names the deadlock's frames (py-spy's format)
OWN_WAIT = ('Thread 10 (idle): "MainThread"\n'
            "    pthread_cond_wait (libc.so.6)\n"
            "    Condition.wait (threading.py:320)\n"
            "        Arguments:\n            self: <Condition at 0x7f0000000010>\n            timeout: None\n"
            "        Locals:\n            note: \"c10d::ProcessGroupGloo::~ProcessGroupGloo (libtorch_cpu.so) "
            "std::thread::join (libstdc++.so.6) c10d::ProcessGroupGloo::runLoop (libtorch_cpu.so) "
            "pybind11::gil_scoped_acquire::gil_scoped_acquire (libtorch_python.so)\"\n"
            "            test_name: \"test_sgd_1d_sharding\"\n"
            "    MultiProcessTestCase.run_test (torch/testing/_internal/common_distributed.py:726)\n"
            "        Arguments:\n            self: <TestDTensorOptimizer at 0x7f0000000020>\n"
            '            test_name: "test_adamw_1d_sharding"\n')


def test_a_dump_is_judged_by_its_frames_never_by_text_in_its_locals(tmp_path):
    """The deadlock's function names, or this project's, in a local's value are no frames."""
    assert sd.read_stuck(OWN_WAIT) == {"test": "TestDTensorOptimizer.test_adamw_1d_sharding",
                                       "gloo_teardown_deadlock": False, "ours": False}
    (tmp_path / "stuck-1.txt").write_text(OWN_WAIT)
    assert ranks.explain_failures({TEST: TIMEOUT}, [str(tmp_path / "stuck-1.txt")], str(tmp_path))[TEST] == {
        "cause": "unexplained", "stacks": ["stuck-1.txt"]}
    # nor is this project's name in a value a frame of it (py-spy escapes a value's newlines)
    dump = open(STUCK).read()
    named = dump.replace('test_name: "test_adamw_1d_sharding"\n', 'test_name: "test_adamw_1d_sharding"\n'
                         '            path: "x\\n    kernel (torchgen_patch_kernels_0123.so)"\n', 1)
    assert named != dump and sd.read_stuck(named) == sd.read_stuck(dump)
    # the deadlock's frames in the right order, in the libraries they live in: it
    assert sd.read_stuck(dump)["gloo_teardown_deadlock"]
    join = "    std::thread::join (libstdc++.so.6.0.30)\n"
    below = dump.replace(join, "", 1).replace("    pybind11::class_<", join + "    pybind11::class_<", 1)
    assert below != dump and not sd.read_stuck(below)["gloo_teardown_deadlock"]  # join calling the destructor
    elsewhere = dump.replace("c10d::ProcessGroupGloo::runLoop (libtorch_cpu.so)",
                             "c10d::ProcessGroupGloo::runLoop (test_helpers.py:12)")
    assert not sd.read_stuck(elsewhere)["gloo_teardown_deadlock"]


def test_rank_timeouts_are_explained_by_their_stuck_ranks_only(tmp_path):
    (tmp_path / "stuck-1.txt").write_text(open(STUCK).read())
    other = TEST.replace("adamw", "sgd")
    cases = {TEST: TIMEOUT, other: TIMEOUT, TEST.replace("adamw", "adam"): ("failed", "AssertionError: x"),
             TEST.replace("adamw", "asgd"): ("passed", "")}
    got = ranks.explain_failures(cases, [str(tmp_path / "stuck-1.txt")], str(tmp_path))
    assert got == {TEST: {"cause": ranks.GLOO_TEARDOWN_DEADLOCK, "stacks": ["stuck-1.txt"]},
                   other: {"cause": "unexplained", "stacks": []}}  # a failure that is no timeout is not read


def _group(unpatched_hangs: int, patched_hangs: int, runs: int = 33) -> dict:
    """A group's results with these many test runs a rank timeout failed by PyTorch's hang, on each side."""
    def side(h):
        return {"counts": {"passed": runs - h, "failed": h},
                "stuck": {"ranks": h, "tests_by_cause": {ranks.GLOO_TEARDOWN_DEADLOCK: h} if h else {}}}
    return {"unpatched": side(unpatched_hangs), "patched": side(patched_hangs)}


def test_a_difference_that_is_pytorchs_own_hang_is_judged_so():
    hang = {"cause": ranks.GLOO_TEARDOWN_DEADLOCK, "stacks": ["stuck-1.txt"]}
    d = {"test": TEST, "unpatched": "passed", "patched": "failed", "stuck": {"patched": hang},
         "reruns": {"unpatched": [{"outcome": "passed"}] * config.RERUNS,
                    "patched": [{"outcome": "failed", "stuck": hang}] + [{"outcome": "passed"}] * (config.RERUNS - 1)}}
    t = _group(2, 3)
    v, why = verdicts.verdict(d, t)
    assert v == verdicts.UPSTREAM_HANG and "patched, group run, patched, alone 1" in why and "#154976" in why
    assert "unpatched 2 of 33, patched 3 of 33" in why
    data = json.load(open(REPORT))
    group = next(iter(config.TEST_GROUPS))
    data["tests"][group] = dict(data["tests"].get(group) or {}, **t, differ=[d])
    assert not [x for x in verdicts.defects(data) if TEST in x]
    # the hang never seen unpatched, or seen patched more often than chance allows: not judged so
    assert verdicts.verdict(d, _group(0, 3))[0] == "unjudged"
    assert verdicts.more_often_patched(verdicts.hang_rates(_group(1, 9))) < verdicts.RATE_P
    assert verdicts.verdict(d, _group(1, 9))[0] == "unjudged"
    assert verdicts.more_often_patched(verdicts.hang_rates(_group(3, 3))) > 0.5
    assert verdicts.more_often_patched(verdicts.hang_rates(_group(0, 0))) == 1.0
    assert verdicts.verdict(d)[0] == "unjudged"  # and never without its group's figures
    # a test that hangs patched far more often than unpatched, in a group whose rates alone pass: not so
    many = dict(d, reruns={"unpatched": [{"outcome": "passed"}] * 5,
                           "patched": [{"outcome": "failed", "stuck": hang}] * 4 + [{"outcome": "passed"}]})
    t2 = _group(6, 11, runs=66)
    assert verdicts.more_often_patched(verdicts.hang_rates(t2)) >= verdicts.RATE_P
    assert verdicts.verdict(many, t2)[0] == "unjudged"
    assert "this test's runs p = 0.0" in verdicts.verdict(many, t2)[1]
    # one failure the stacks do not explain, or none captured: not PyTorch's hang
    d["reruns"]["patched"][0] = {"outcome": "failed", "stuck": {"cause": "unexplained", "stacks": []}}
    assert verdicts.verdict(d, t)[0] == "unjudged" and f"{group}: {TEST}: unjudged" in verdicts.defects(data)
    d["reruns"]["patched"][0] = {"outcome": "failed"}
    assert verdicts.verdict(d, t)[0] == "unjudged"
    # a test that never passed on one side is not judged so, whatever its stacks
    d["reruns"]["patched"] = [{"outcome": "failed", "stuck": hang}] * config.RERUNS
    assert verdicts.verdict(d, t)[0] == "unjudged"
    del d["reruns"]  # and never without the runs alone
    assert verdicts.verdict(d, t)[0] == "unjudged"


def test_results_of_other_settings_than_the_checks_are_no_pass():
    data = json.load(open(REPORT))
    group = "DTensor optimizers (CPU)"
    assert not [x for x in verdicts.defects(data) if "other files" in x]
    data["tests"][group]["runs"] = config.GROUP_RUNS[group] - 1
    assert f"{group}: its results are of other files, runs or settings than the check's now: run it again" \
        in verdicts.defects(data)


def test_a_dump_that_failed_or_names_no_test_explains_nothing(tmp_path):
    (tmp_path / "stuck-1.txt").write_text(open(STUCK).read())
    cases = {TEST: TIMEOUT}
    assert ranks.explain_failures(cases, [str(tmp_path / "stuck-1.txt")], str(tmp_path), failed_dumps=1)[TEST][
        "cause"] == "unexplained"
    # a run_test frame without its arguments (py-spy without --locals) names no test, and is read at once
    bare = "Thread 1 (idle): \"MainThread\"\n" + "    MultiProcessTestCase.run_test (x.py:1)\n" + \
        "    f (x.py:2)\n" * 2000
    t0 = time.monotonic()
    assert sd.read_stuck(bare)["test"] is None and time.monotonic() - t0 < 1
    (tmp_path / "stuck-2.txt").write_text(bare)
    assert ranks.explain_failures(cases, [str(tmp_path / "stuck-2.txt")], str(tmp_path))[TEST]["cause"] == "unexplained"
    # a dump beside it that names no test, or shows a frame of this project, may be this test's rank
    assert ranks.explain_failures(cases, [str(tmp_path / "stuck-1.txt"), str(tmp_path / "stuck-2.txt")],
                               str(tmp_path))[TEST]["cause"] == "unexplained"
    ours = open(STUCK).read().replace("test_adamw_1d_sharding", "test_sgd_1d_sharding").replace(
        "(libc10.so)", "(torchgen_patch_boxed_0123.so)", 1)
    (tmp_path / "stuck-3.txt").write_text(ours)
    assert ranks.explain_failures(cases, [str(tmp_path / "stuck-1.txt"), str(tmp_path / "stuck-3.txt")],
                               str(tmp_path))[TEST]["cause"] == "unexplained"
    # the main thread not in the destructor's join: another hang
    no_join = open(STUCK).read().replace("std::thread::join", "std::condition_variable::wait")
    assert not sd.read_stuck(no_join)["gloo_teardown_deadlock"]


def test_ranks_alive_too_long_are_dumped_while_they_run(tmp_path, monkeypatch):
    """StuckRanks on a real process tree: a child whose command line marks it as a multiprocessing rank is
    dumped once (by a stand-in py-spy printing the stuck rank's stacks), its parent is not."""
    monkeypatch.setattr(ranks, "STUCK_AFTER_S", 1)
    py_spy = tmp_path / "py-spy"
    py_spy.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\ncat {STUCK}\n")
    py_spy.chmod(0o755)
    rank = "import time; time.sleep(30)"
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                               f"{rank!r}, 'multiprocessing.' + 'spawn'])"])
    watch = ranks.StuckRanks(parent.pid, str(py_spy), str(tmp_path))
    watch.start()
    try:
        deadline = time.monotonic() + 20
        while not watch.dumps and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(3)  # a second poll: dumped once only
    finally:
        watch.done.set()
        watch.join()
        for p in ranks.children(parent.pid):  # the rank first: once its parent is gone, it is no child of it
            os.kill(p, 9)
        parent.kill()
        parent.wait()
    assert len(watch.dumps) == 1, watch.dumps
    assert open(watch.dumps[0]).read() == open(STUCK).read()
    pid = int(open(tmp_path / "args").read().split("--pid")[1])
    assert pid != parent.pid and pid in [int(x) for x in re.findall(r"stuck-(\d+)", watch.dumps[0])]


def test_a_group_run_several_times_is_compared_over_all_its_runs(tmp_path, monkeypatch):
    """step_tests with the runs stood in for: outcomes over three runs a side, alternating; a test whose every
    failure is PyTorch's hang (on either side) is judged so, one with a failure nothing explains is not."""
    group = "DTensor optimizers (CPU)"
    hang = {"cause": ranks.GLOO_TEARDOWN_DEADLOCK, "stacks": ["x"]}
    other = {"cause": "unexplained", "stacks": []}
    A, B, C = (f"t.TestD.test_{x}" for x in "abc")
    plan = iter([  # unpatched 1, patched 1, unpatched 2, ...: (outcomes, stuck)
        ({A: "passed", B: "passed", C: "passed"}, {}), ({A: "failed", B: "passed", C: "passed"}, {A: hang}),
        ({A: "passed", B: "failed", C: "passed"}, {B: hang}), ({A: "passed", B: "passed", C: "failed"}, {C: other}),
        ({A: "passed", B: "passed", C: "passed"}, {}), ({A: "passed", B: "passed", C: "passed"}, {})])
    order = []

    def fake(tree, python, files, patched, xml, log, env=None):
        outcomes, stuck = next(plan)
        order.append("patched" if patched else "unpatched")
        counts = {}
        for o in outcomes.values():
            counts[o] = counts.get(o, 0) + 1
        return {"rc": int("failed" in counts), "wall_s": 1.0, "counts": counts, "outcomes": outcomes,
                "skip_reasons": {}, "stuck": stuck, "stuck_ranks": len(stuck)}

    monkeypatch.setattr(groups, "run_tests", fake)
    monkeypatch.setitem(config.GROUP_RUNS, group, 3)
    t = groups.step_tests(group, str(tmp_path), str(tmp_path), "python")
    assert order == ["unpatched", "patched"] * 3
    assert t["runs"] == 3 and t["unpatched"]["counts"] == {"passed": 8, "failed": 1}
    assert t["patched"]["stuck"] == {"ranks": 2, "tests_by_cause": {ranks.GLOO_TEARDOWN_DEADLOCK: 1, "unexplained": 1},
                                     "failed_dumps": 0}
    got = {d["test"]: (d["unpatched"], d["patched"], verdicts.verdict(d, t)[0]) for d in t["differ"]}
    assert got == {A: ("passed", "failed 1, passed 2", verdicts.UPSTREAM_HANG),
                   B: ("failed 1, passed 2", "passed", verdicts.UPSTREAM_HANG),
                   C: ("passed", "failed 1, passed 2", "unjudged")}
    assert "reruns" not in t["differ"][0]  # three runs a side are the evidence; none alone
