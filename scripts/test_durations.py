"""tests/durations.json from a measured test run: the seconds each item took, setup and teardown
included, from pytest's junit XML (``--junitxml``) or from the log of ``--durations=0``. The tests'
``slow`` mark (tests/tiers.py) is read from it, so `make check` leaves out what took long.

    python scripts/test_durations.py build/pytest-junit.xml [more.xml or .txt ...] [-o tests/durations.json]

Several inputs are merged (a later one wins for an item both measured); items under 0.05 s are left
out (an absent item counts as fast)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s (?:setup|call|teardown)\s+(\S+::\S.*?)\s*$")


def _node_id(classname: str, name: str) -> str:
    """pytest's node id of a junit test case: the longest dotted prefix of ``classname`` that is a file
    of the checkout is the module, the rest its classes."""
    parts = classname.split(".")
    for n in range(len(parts), 0, -1):
        path = "/".join(parts[:n]) + ".py"
        if os.path.isfile(os.path.join(ROOT, path)):
            return "::".join([path, *parts[n:], name])
    return "::".join([classname.replace(".", "/") + ".py", name])


def from_junit(path: str) -> dict[str, float]:
    cases = ET.parse(path).getroot().iter("testcase")
    return {_node_id(c.get("classname", ""), c.get("name", "")): float(c.get("time", 0)) for c in cases}


def from_log(path: str) -> dict[str, float]:
    """The ``--durations=0`` table of a pytest log: its setup, call and teardown lines summed per item."""
    seconds: dict[str, float] = {}
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            m = _LINE.match(line)
            if m:
                seconds[m.group(2)] = seconds.get(m.group(2), 0.0) + float(m.group(1))
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="pytest junit XML files or logs of --durations=0")
    ap.add_argument("-o", "--output", default=os.path.join(ROOT, "tests", "durations.json"))
    ap.add_argument("--note", default="", help="how and where it was measured (kept in the file)")
    args = ap.parse_args(argv)
    seconds: dict[str, float] = {}
    for path in args.inputs:
        try:
            seconds.update(from_junit(path) if path.endswith(".xml") else from_log(path))
        except (OSError, ET.ParseError) as e:
            print(f"error: {path}: {e}", file=sys.stderr)
            return 2
    if not seconds:
        print(f"error: no test durations in {', '.join(args.inputs)} (hint: pytest --junitxml or --durations=0)",
              file=sys.stderr)
        return 2
    kept = {k: round(v, 2) for k, v in sorted(seconds.items()) if v >= 0.05}
    doc = {"note": args.note, "items": len(seconds), "total_s": round(sum(seconds.values()), 1), "seconds": kept}
    with open(args.output, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=0, sort_keys=False)
        fh.write("\n")
    slow = sum(1 for v in seconds.values() if v > 5)
    print(f"{args.output}: {len(seconds)} items, {doc['total_s']} s in all, {slow} over 5 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
