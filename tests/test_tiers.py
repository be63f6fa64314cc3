"""The short tier (`make check`): the marks tests/tiers.py gives an item from what it uses and from the
committed durations, scripts/test_durations.py that writes those, and the Makefile's two setups
(`make run` installs what the main job needs only)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types

import pytest

from tests import tiers
from tests.conftest import ROOT


def _item(nodeid="tests/test_x.py::test_y", fixtures=(), marks=(), function=None, params=None):
    return types.SimpleNamespace(nodeid=nodeid, fixturenames=list(fixtures), function=function,
                                 iter_markers=lambda: [types.SimpleNamespace(name=m) for m in marks],
                                 **({"callspec": types.SimpleNamespace(params=params)} if params else {}))


def _in_process():
    return 1


def _starts_python():
    return subprocess.run([sys.executable, "-c", "pass"])


@pytest.mark.parametrize("kw,want", [
    ({}, []),
    ({"fixtures": ["tmp_path", "library"]}, ["build"]),  # the session's kernels, or what needs them (patched)
    ({"fixtures": ["deepspeed_ops"]}, ["build"]),
    ({"marks": ["build"]}, ["build"]),
    ({"params": {"kernels": "cpp"}}, ["build"]),  # asks for the library while it runs
    ({"params": {"kernels": "python"}}, []),
    ({"params": {"check_path": "native"}}, ["build"]),
    ({"fixtures": ["user_venv"]}, ["venv"]),
    ({"function": _starts_python}, ["program"]),
    ({"function": _in_process}, []),
    ({"nodeid": "tests/test_x.py::test_slow"}, ["long", "slow"]),
    ({"nodeid": "tests/test_x.py::test_five"}, ["long"]),  # over 5 s, not 5 s itself
    ({"nodeid": "tests/test_x.py::test_one"}, []),  # over 1 s, not 1 s itself
    ({"nodeid": "tests/test_selfcheck.py::test_mypy_finds_nothing"}, ["long", "slow", "core"]),
])
def test_an_items_marks_come_from_what_it_uses_and_how_long_it_took(kw, want):
    durations = {"tests/test_x.py::test_slow": 5.2, "tests/test_x.py::test_five": 5.0, "tests/test_x.py::test_one": 1.0,
                 "tests/test_selfcheck.py::test_mypy_finds_nothing": 28.0}
    assert tiers.marks_for(_item(**kw), durations) == want


def test_the_committed_durations_name_items_that_exist():
    """tests/durations.json is read by node id: an id that no longer names an item would leave a slow
    test in the short tier, unseen."""
    ids = set(tiers.load_durations())
    assert ids, "tests/durations.json is missing or empty"
    files = {i.split("::")[0] for i in ids}
    assert [f for f in files if not f.endswith(".py") or not os.path.isfile(os.path.join(ROOT, f))] == []


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_tiers" name="test_a[x-1]" time="6.5"/>
<testcase classname="tests.test_tiers" name="test_b" time="0.01"/>
<testcase classname="tests.test_tiers.TestC" name="test_c" time="1.25"/>
</testsuite></testsuites>"""
LOG = """============================= slowest durations ==============================
3.00s call     tests/test_tiers.py::test_a[x y]
2.50s setup    tests/test_tiers.py::test_a[x y]
0.20s teardown tests/test_tiers.py::test_d
1 passed in 9.00s
"""


def test_durations_come_from_junit_xml_or_a_durations_log_and_are_read_back(tmp_path):
    (tmp_path / "j.xml").write_text(JUNIT)
    (tmp_path / "d.txt").write_text(LOG)
    out = tmp_path / "durations.json"
    r = subprocess.run([sys.executable, f"{ROOT}/scripts/test_durations.py", str(tmp_path / "j.xml"),
                        str(tmp_path / "d.txt"), "-o", str(out), "--note", "a test"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{out}: 5 items, 13.5 s in all, 2 over 5 s\n"
    assert json.loads(out.read_text())["note"] == "a test"
    assert tiers.load_durations(str(out)) == {  # the item under 0.05 s left out: an absent one is fast
        "tests/test_tiers.py::test_a[x-1]": 6.5, "tests/test_tiers.py::TestC::test_c": 1.25,
        "tests/test_tiers.py::test_a[x y]": 5.5, "tests/test_tiers.py::test_d": 0.2}


def test_a_run_with_no_durations_is_refused(tmp_path):
    (tmp_path / "d.txt").write_text("1 passed in 2.00s\n")
    r = subprocess.run([sys.executable, f"{ROOT}/scripts/test_durations.py", str(tmp_path / "d.txt"), "-o",
                        str(tmp_path / "o.json")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: no test durations in ")
    assert not (tmp_path / "o.json").exists()


def _report(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, f"{ROOT}/scripts/durations_report.py", *argv], capture_output=True,
                          text=True)


def test_the_durations_report_sums_each_file_and_lists_the_slowest_items_the_same_each_time(tmp_path):
    """From a junit XML: each file's items and seconds, the slowest first, then the slowest items (ties by name);
    the same XML gives the same bytes."""
    (tmp_path / "j.xml").write_text(JUNIT.replace("</testsuite>", '<testcase classname="tests.test_tiers" '
                                                  'name="test_e[a|b]" time="1.25"/></testsuite>'))
    out = tmp_path / "r.md"
    r = _report(str(tmp_path / "j.xml"), "--torch", "2.13.0", "-o", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert text.startswith("# Test durations, CPU, torch 2.13.0\n\nFrom `j.xml`, the junit XML of the last "
                           "`make test`: 4 items, 9.0 s in all")
    assert "| tests/test_tiers.py | 4 | 9.0 | 100.0% |" in text
    assert text.endswith("| seconds | item |\n|---:|---|\n| 6.50 | tests/test_tiers.py::test_a[x-1] |\n"
                         "| 1.25 | tests/test_tiers.py::TestC::test_c |\n"
                         "| 1.25 | tests/test_tiers.py::test_e[a\\|b] |\n"
                         "| 0.01 | tests/test_tiers.py::test_b |\n")
    assert str(tmp_path) not in text
    again = tmp_path / "again.md"
    assert _report(str(tmp_path / "j.xml"), "--torch", "2.13.0", "-o", str(again)).returncode == 0
    assert again.read_bytes() == out.read_bytes()


def test_the_durations_report_orders_files_by_their_seconds_and_keeps_25_items():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import durations_report as dr

    seconds = {f"tests/test_{f}.py::test_{i}": float(i) for f in "ab" for i in range(20)}
    seconds["tests/test_c.py::test_big"] = 500.0
    assert [f for f, _, _ in dr.by_file(seconds)] == ["tests/test_c.py", "tests/test_a.py", "tests/test_b.py"]
    top = dr.slowest(seconds)
    assert len(top) == 25 and top[0] == ("tests/test_c.py::test_big", 500.0)
    assert top[1:3] == [("tests/test_a.py::test_19", 19.0), ("tests/test_b.py::test_19", 19.0)]


def test_the_durations_report_refuses_a_run_with_no_durations(tmp_path):
    (tmp_path / "j.xml").write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest"/></testsuites>')
    r = _report(str(tmp_path / "j.xml"), "-o", str(tmp_path / "r.md"))
    assert r.returncode == 2 and r.stderr.startswith("error: no test durations in ")
    assert not (tmp_path / "r.md").exists()
    r = _report(str(tmp_path / "missing.xml"), "-o", str(tmp_path / "r.md"))
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr


def test_make_durations_writes_the_report_of_the_last_make_test_too():
    make = open(f"{ROOT}/Makefile", encoding="utf-8").read()
    _, durations = _recipe(make, "durations")
    assert durations[-1] == "$(BIN)/python scripts/durations_report.py build/pytest-junit.xml"


def _recipe(make: str, target: str) -> tuple[str, list[str]]:
    """A Makefile rule's prerequisites and its recipe's lines."""
    head, _, rest = make.partition(f"\n{target}:")
    lines = rest.split("\n\n", 1)[0].splitlines()
    return lines[0], [line.strip() for line in lines[1:]]


def test_make_run_installs_the_run_requirements_only_and_make_test_the_rest():
    make = open(f"{ROOT}/Makefile", encoding="utf-8").read()
    run_needs, _ = _recipe(make, "run")
    assert run_needs.split() == ["$(RUN_STAMP)"]
    _, run_setup = _recipe(make, "$(RUN_STAMP)")
    assert [line for line in run_setup if "-r requirements" in line] == \
        ["$(BIN)/python -m pip install -q -r requirements-run.txt"]
    dev_needs, dev_setup = _recipe(make, "$(STAMP)")
    assert "$(RUN_STAMP)" in dev_needs.split() and any("-r requirements-dev.txt" in line for line in dev_setup)
    run = [re.split(r"[=<>\s]", line)[0] for line in open(f"{ROOT}/requirements-run.txt", encoding="utf-8")
           if line.strip() and not line.startswith("#")]
    assert run == ["torch", "numpy", "pyyaml", "jinja2", "ninja"]
    assert "-r requirements-run.txt\n" in open(f"{ROOT}/requirements-dev.txt", encoding="utf-8").read()


def test_make_check_leaves_out_by_the_marks_and_make_test_runs_everything_with_its_slowest():
    """`make check`'s items each took at most 2 s (LONG_S), but the self-check; `make test` runs all."""
    make = open(f"{ROOT}/Makefile", encoding="utf-8").read()
    _, check = _recipe(make, "check")
    marks = "not build and not venv and not sampled and (not long or core)"
    assert check == [f'$(BIN)/python -m pytest -q -ra -m "{marks}" --durations=10']
    _, test = _recipe(make, "test")
    assert test[-1] == "$(BIN)/python -m pytest -q -ra --durations=25 --junitxml=build/pytest-junit.xml"


def test_of_a_sampled_family_the_short_tier_runs_one_case_in_n_and_those_it_always_runs():
    family = "tests/test_cli_flags.py::test_flag_is_honoured"
    ids = [f"{family}[{c}-{f}]" for c in ("run", "lint", "verify") for f in ("--a", "--b", "--c", "--d")]
    ids += ["tests/test_cli_flags.py::test_other[run---a]", "tests/test_x.py::test_y"]
    # counted across the family, lint's (always run) left out of the count
    assert tiers.sampled(ids) == {f"{family}[run---b]", f"{family}[run---c]", f"{family}[verify---a]",
                                  f"{family}[verify---b]", f"{family}[verify---d]"}
