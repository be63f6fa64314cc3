"""Argument names that would break the generated C++ (keywords, macros of the compiler, the C and
C++ libraries and torch's headers, the template's own names, a written argument's snapshot) are
renamed by a fixed mangling; names C++ reserves for its implementation, and operator names no C++
function can have (a keyword, a macro), are refused at their yaml line. So gen --strict never
writes C++ that cannot compile."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.support import scan_of
from tests.yaml_fixtures import subset_yaml
from torchgen_patch.codegen import render
from torchgen_patch.plan import make_plan
from torchgen_patch.plan.overlay import empty

REAL = "_cummax_helper(Tensor self, Tensor(a!) values, Tensor(b!) indices, int dim) -> ()"
# the real op's schema with its argument names replaced: the C++ call passes them by position
CASES = {
    "keywords": ("_cummax_helper(Tensor this, Tensor(a!) new, Tensor(b!) template, int delete) -> ()",
                 {"this": "this_", "new": "new_", "template": "template_", "delete": "delete_"}),
    "template_locals": ("_cummax_helper(Tensor ks, Tensor(a!) guard, Tensor(b!) indices, int at) -> ()",
                        {"ks": "ks_", "guard": "guard_", "at": "at_"}),
    "snapshot": ("_cummax_helper(Tensor values_before, Tensor(a!) values, Tensor(b!) indices, int dim) -> ()",
                 {"values_before": "values_before_"}),
    # macros of the C library (<cerrno>, <cstdio>, <cstddef>); torchgen itself refuses Python keywords (assert)
    "macros": ("_cummax_helper(Tensor errno, Tensor(a!) EOF, Tensor(b!) NULL, int stdin) -> ()",
               {"errno": "errno_", "EOF": "EOF_", "NULL": "NULL_", "stdin": "stdin_"}),
}


def _plan(tmp_path, schema):
    native, tags = subset_yaml(str(tmp_path), ["_cummax_helper"], ((REAL, schema),))
    return make_plan(scan_of(native, tags, cache=False), empty(), strict=True), native


@pytest.mark.parametrize("case", sorted(CASES))
def test_names_are_mangled(tmp_path, case):
    schema, renamed = CASES[case]
    plan, _ = _plan(tmp_path, schema)
    (k,) = plan.kernels
    names = [n for _, n in k.formals]
    for old, new in renamed.items():
        assert new in names and old not in names
    assert list(k.call_args) == names  # the call passes what the declaration declares
    text = render(plan, 1)["ADInplaceOrViewPatch_0.cpp"].decode()
    decl = text[text.index("void _cummax_helper("):].split("{", 1)[0]
    for new in renamed.values():
        assert f" {new}," in decl or f" {new})" in decl, decl


def test_gen_strict_accepts_mangled_names(tmp_path, run_cli):
    native, _ = subset_yaml(str(tmp_path), ["_cummax_helper"], ((REAL, CASES["keywords"][0]),))
    rc, _, err = run_cli("gen", "--strict", "--native-functions", native, "-o", tmp_path / "g")
    assert rc == 0, err
    text = (tmp_path / "g" / "ADInplaceOrViewPatch_0.cpp").read_text() + \
        (tmp_path / "g" / "ADInplaceOrViewPatch_1.cpp").read_text()
    assert "at::Tensor & new_" in text and "const auto new__before" in text


@pytest.mark.build
def test_mangled_cases_compile(tmp_path):
    """Every mangled case, compiled against the running torch (one library, one shard each)."""
    from torchgen_patch.runtime.compile import build

    for case in sorted(CASES):
        (tmp_path / case).mkdir()
        plan, _ = _plan(tmp_path / case, CASES[case][0])
        lib = build(render(plan, 1), plan.ops(), 1)
        assert os.path.isfile(lib.path), case


@pytest.mark.parametrize("schema,said", [
    ("_cummax_helper(Tensor __LINE__, Tensor(a!) values, Tensor(b!) indices, int dim) -> ()",
     "argument name '__LINE__' is reserved for the C++ implementation"),
    ("_cummax_helper(Tensor self, Tensor(a!) _Values, Tensor(b!) indices, int dim) -> ()",
     "argument name '_Values' is reserved"),
])
def test_reserved_argument_names_are_refused_at_their_line(tmp_path, run_cli, schema, said):
    native, _ = subset_yaml(str(tmp_path), ["_cummax_helper"], ((REAL, schema),))
    _refused(run_cli, native, tmp_path, said)


def _refused(run_cli, native, tmp_path, said):
    for strict in (["--strict"], []):
        rc, _, err = run_cli("gen", *strict, "--native-functions", native, "-o", tmp_path / "g")
        assert rc == 2 and len(err.splitlines()) == 1 and said in err, err
        assert re.match(rf"{re.escape(native)}:1: error: ", err) and "Traceback" not in err, err
        assert not os.path.exists(tmp_path / "g")


@pytest.mark.parametrize("op,said", [("delete", "a C++ keyword"), ("errno", "a macro's name"),
                                     ("EOF", "a macro's name"), ("__linux__", "reserved for the C++ implementation")])
def test_operator_names_no_cpp_function_can_have_are_refused_at_their_line(tmp_path, run_cli, op, said):
    """A mutable operator with no overload name, written with its out= variant (as torchgen wants): its
    kernel would be the C++ function ``op``."""
    from tests.support import packaged_yaml

    native = tmp_path / "native_functions.yaml"
    native.write_text(f"- func: {op}(Tensor self, Tensor(a!)[] dst) -> ()\n"
                      f"- func: {op}.out(Tensor self, Tensor(a!)[] dst, *, Tensor(b!)[] out) -> ()\n")
    (tmp_path / "tags.yaml").write_text(open(packaged_yaml()[1]).read())
    _refused(run_cli, str(native), tmp_path, f"aten::{op}: its C++ name '{op}' is {said}")


def test_pythons_operator_names_stay_valid():
    from torchgen_patch.plan import function_name_problem

    assert function_name_problem("__ilshift___Tensor") is None and function_name_problem("__and__") is None
    assert function_name_problem("linalg__powsum") is None  # '__' inside: no macro starts so
    assert function_name_problem("__linux___out") and function_name_problem("_Foo")


def _macros_where_kernels_compile(tmp_path) -> set[str]:
    """Every macro defined where the generated kernels are compiled, as `c++ -dM -E` lists them for a
    rendered shard and register file: the compiler's own (GNU mode, as CMake's default builds), the C
    and C++ libraries' and torch's headers'."""
    cxx = shutil.which(os.environ.get("CXX", "c++"))
    if cxx is None:
        pytest.skip("no C++ compiler")
    pytest.importorskip("torch")
    from torch.utils.cpp_extension import include_paths

    plan, _ = _plan(tmp_path, REAL)
    out = tmp_path / "g"
    out.mkdir()
    for name, data in render(plan, 1).items():
        (out / name).write_bytes(data)
    found = set()
    for name in ("ADInplaceOrViewPatch_0.cpp", "RegisterADInplaceOrViewPatch.cpp"):
        r = subprocess.run([cxx, "-std=gnu++17", "-dM", "-E", *[f"-I{p}" for p in include_paths()], str(out / name)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        found |= {ln.split()[1].split("(")[0] for ln in r.stdout.splitlines() if ln.startswith("#define ")}
    return found


def test_every_macro_where_the_kernels_compile_is_mangled_or_refused(tmp_path):
    """The rule is the tool's (a fixed list and spellings, so the output is the same on every machine);
    this checks it against the macros the compiler here really defines: each, as an argument name, is
    renamed to a name that is no macro, or refused as reserved; as an operator's C++ name, refused."""
    from torchgen_patch.plan import cpp_names, function_name_problem, reserved

    macros = _macros_where_kernels_compile(tmp_path)
    assert len(macros) > 1000 and {"errno", "EOF", "NULL", "assert", "linux"} <= macros
    missed = sorted(m for m in macros if not reserved(m) and (m not in cpp_names([m], []) or cpp_names([m], [])[m]
                                                              in macros))
    assert not missed, f"argument names that are macros here and pass unchanged: {missed[:20]}"
    passed = sorted(m for m in macros if function_name_problem(m) is None)
    assert not passed, f"operator names that are macros here and pass: {passed[:20]}"
