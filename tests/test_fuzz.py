"""Issue 8: property-based fuzzing of the yaml and overlay loaders and of the
lint entry point. Every input ends in exit 0, 1 or 2 with at most one error
line, never a traceback. CI runs a short fixed-seed run; FUZZ_EXAMPLES=N runs
a longer one (the README reports the latest)."""

import os

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from tests.yaml_fixtures import subset_yaml
from torchgen_patch import cli

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))
FUNCS = ["add.Tensor", "add_.Tensor", "add.out", "_cummax_helper", "_foreach_add.Scalar", "_foreach_add_.Scalar"]
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    native, tags = subset_yaml(str(d), FUNCS)
    with open(native, "rb") as fh:
        return str(d), fh.read()


def _mutate(data: bytes, ops) -> bytes:
    b = bytearray(data)
    for kind, pos, value in ops:
        if not b:
            b = bytearray(value)
            continue
        i = pos % len(b)
        if kind == "flip":
            b[i] ^= value[0] if value else 1
        elif kind == "insert":
            b[i:i] = value
        elif kind == "delete":
            del b[i:i + 1 + (value[0] % 8 if value else 0)]
        elif kind == "truncate":
            del b[i:]
        elif kind == "dup_line":
            j = b.find(b"\n", i)
            k = b.rfind(b"\n", 0, i)
            b[k + 1:k + 1] = b[k + 1:j + 1] if j > k else b""
    return bytes(b)


MUTATIONS = st.lists(st.tuples(st.sampled_from(["flip", "insert", "delete", "truncate", "dup_line"]),
                               st.integers(min_value=0, max_value=10**6),
                               st.binary(min_size=0, max_size=6)), min_size=1, max_size=4)
INTERESTING = st.sampled_from([b"- func: ", b"(", b")", b"->", b"Tensor(a!)", b"[]", b"?", b":", b"\n  ",
                               b"dispatch:", b"tags: ", b"\t", b"\xff", b"&a", b"*a", b"!!python/object", b"{", b"'"])


def _insert(data: bytes, extra) -> bytes:
    for pos, token in extra:
        i = pos % (len(data) + 1)
        data = data[:i] + token + data[i:]
    return data


def _run(capsys, *argv):
    try:
        rc = cli.main([str(a) for a in argv])
    except SystemExit as e:  # argparse, never for file content
        rc = e.code
    out, err = capsys.readouterr()
    assert rc in (0, 1, 2), rc
    if rc == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and ": error: " in lines[0], err
    return rc


@seed(20261130)
@SETTINGS
@given(ops=MUTATIONS, extra=st.lists(st.tuples(st.integers(0, 10**6), INTERESTING), max_size=3))
def test_fuzz_native_functions_lint(base, capsys, ops, extra):
    d, data = base
    data = _insert(_mutate(data, ops), extra)
    p = os.path.join(d, "native_functions.yaml")
    with open(p, "wb") as fh:
        fh.write(data)
    _run(capsys, "lint", "--no-cache", "--no-overlay", p)


OVERLAY_OK = (b"aten::_cummax_helper:\n  action: skip\n  reason: fuzz\n"
              b"aten::_foreach_add_.Scalar:\n  action: xfail\n  reason: r\n  devices: [cuda]\n")


@seed(20261130)
@SETTINGS
@given(ops=MUTATIONS, extra=st.lists(st.tuples(st.integers(0, 10**6), INTERESTING), max_size=3))
def test_fuzz_overlay(base, capsys, ops, extra, tmp_path_factory):
    d, data = base
    p = os.path.join(d, "native_functions.yaml")
    with open(p, "wb") as fh:
        fh.write(data)
    ov = _insert(_mutate(OVERLAY_OK, ops), extra)
    o = os.path.join(d, "overlay.yaml")
    with open(o, "wb") as fh:
        fh.write(ov)
    _run(capsys, "lint", "--no-cache", "--overlay", o, p)
