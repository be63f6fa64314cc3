"""Hostile input to the CI lint (a pull request writes the yaml): every case, run in a fresh
process under a 500 MB address-space limit, ends within its time bound with a normal result or
one `FILE:LINE: error:` line and exit 2 — never a hang, a crash, a traceback or code execution.

The time bound is max(5 s, 3 x the same lint of a one-entry yaml measured here), since this
machine's speed varies threefold from day to day; the figures of a run are printed with -s."""

from __future__ import annotations

import json
import os
import re
import statistics

import pytest

from tests import adversarial_yaml as adv
from tests.support import packaged_yaml

CASES = adv.cases()
# what the one error line must say (a substring); None: a normal result is as good as a clean error
EXPECT = {
    "laughs-list-": "YAML aliases (*name) are not allowed", "laughs-map-": "YAML aliases (*name) are not allowed",
    "laughs-unknown-field": "YAML aliases", "laughs-whole-entry": "YAML aliases",
    "laughs-merge-key": "could not determine a constructor for the tag 'tag:yaml.org,2002:merge'",
    "laughs-tags-": "YAML aliases (*name) are not allowed in tags.yaml",
    "laughs-overlay-key": "operator name must be a string", "laughs-overlay-": "must be a string",
    "nested-overlay-small": "exceeded maximum nesting depth", "nested-overlay": "the overlay is",
    "nested-baseline": "baseline is not valid JSON",
    "nested-": "exceeded maximum nesting depth",
    "long-line-schema": "characters (the limit is 10,000", "long-line-": None, "long-baseline": None,
    "many-entries": "has 30,000 entries; the limit is 10,000", "many-keys-in-one-entry": "a mapping of 60,001 keys",
    "many-dispatch-keys": "a mapping of 60,000 keys", "many-overlay-entries": "the overlay is",
    "tag-binary": "entry has no 'func:' schema string", "tag-": "could not determine a constructor for the tag",
    "overlay-tag-": "'reason' must be a string", "tags-python-tag": "could not determine a constructor",
    "invalid-utf8": "is not valid UTF-8", "utf16-bom": "is not valid UTF-8", "nul-bytes": "control characters",
    "devzero-": "is not a regular file", "fifo-": "is not a regular file",
}
ERROR_LINE = re.compile(r"^\S.*?(:\d+)?: error: .+$")


def expected(name: str) -> str | None:
    return next(v for k, v in EXPECT.items() if name.startswith(k))


def test_every_case_has_an_expectation():
    for c in CASES:
        expected(c.name)  # StopIteration: a case nobody thought about


@pytest.fixture(scope="module")
def bound(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("anchor"))
    path = os.path.join(d, "native_functions.yaml")
    with open(path, "w") as fh:
        fh.write(adv.OK_ENTRY)
    tags = packaged_yaml()[1]
    runs = [adv.run_bounded(adv.command(None, path, tags), d, timeout=120) for _ in range(3)]
    assert all(r.returncode == 1 for r in runs), runs[0].stderr  # its one op is a finding
    anchor = statistics.median(r.seconds for r in runs)
    return max(5.0, 3 * anchor), anchor


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input_is_bounded_and_clean(case, tmp_path, bound):
    limit, anchor = bound
    tags = packaged_yaml()[1]
    path = adv.materialize(case, str(tmp_path), tags)
    r = adv.run_bounded(adv.command(case, path, tags), str(tmp_path), timeout=limit + 30)
    print(f"{case.name}: exit {r.returncode} in {r.seconds:.1f} s (bound {limit:.1f} s, anchor {anchor:.1f} s)")
    assert r.returncode is not None, f"still running after {limit + 30:.0f} s"
    assert "Traceback" not in r.stderr and "MemoryError" not in r.stderr, r.stderr[-2000:]
    assert r.returncode in (0, 1, 2), (r.returncode, r.stderr[-2000:])
    if r.returncode == 2:
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and ERROR_LINE.match(lines[0]), lines[:3]
        assert r.stdout == ""
    else:
        doc = json.loads(r.stdout)
        assert isinstance(doc["findings"], list)
    want = expected(case.name)
    if want is not None:
        assert r.returncode == 2 and want in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "PWNED")
    assert r.seconds <= limit, f"{r.seconds:.1f} s, over the bound of {limit:.1f} s"
