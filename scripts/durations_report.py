"""reports/test-durations-cpu-torch<version>.md: where the suite's time goes, from the junit XML of the
last `make test` (`make durations` writes it beside tests/durations.json): the seconds of each test file,
slowest first, and the 25 slowest items. Setup and teardown are counted with their item, as pytest's
junit XML counts them. The same XML gives the same file, byte for byte.

    python scripts/durations_report.py build/pytest-junit.xml [-o reports/...md] [--torch 2.13.0]

tests/durations.json (what `make durations` keeps of a run) is read too, for a report of the committed
measurement; its items under 0.05 s are not in it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_durations import ROOT, from_junit  # noqa: E402  (the node ids tests/durations.json is keyed by)

SLOWEST = 25


def _shown(path: str) -> str:
    """``path`` as the report names it: relative to the checkout, else its file name (no absolute path)."""
    rel = os.path.relpath(os.path.abspath(path), ROOT)
    return os.path.basename(path) if rel.startswith(os.pardir) else rel


def by_file(seconds: dict[str, float]) -> list[tuple[str, int, float]]:
    """(file, items, seconds) of each test file, the slowest first (ties by name)."""
    files: dict[str, list[float]] = {}
    for node, s in seconds.items():
        files.setdefault(node.split("::", 1)[0], []).append(s)
    return sorted(((f, len(v), sum(v)) for f, v in files.items()), key=lambda r: (-round(r[2], 2), r[0]))


def slowest(seconds: dict[str, float], n: int = SLOWEST) -> list[tuple[str, float]]:
    """The ``n`` slowest items, the slowest first (ties by node id)."""
    return sorted(seconds.items(), key=lambda kv: (-round(kv[1], 2), kv[0]))[:n]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(seconds: dict[str, float], source: str, torch: str) -> str:
    """The report of ``seconds`` (node id -> seconds), measured as ``source`` says, on torch ``torch``."""
    total = sum(seconds.values())
    lines = [f"# Test durations, CPU, torch {torch}", "",
             f"{source}: {len(seconds)} items, {total:.1f} s in all (setup and teardown counted with their item). "
             "`make test`, then `make durations`, writes this file again.", "",
             "## By file, the slowest first", "", "| file | items | seconds | share |", "|---|---:|---:|---:|"]
    lines += [f"| {_cell(f)} | {n} | {s:.1f} | {100 * s / total if total else 0:.1f}% |"
              for f, n, s in by_file(seconds)]
    lines += ["", f"## The {SLOWEST} slowest items", "", "| seconds | item |", "|---:|---|"]
    lines += [f"| {s:.2f} | {_cell(node)} |" for node, s in slowest(seconds)]
    return "\n".join(lines) + "\n"


def _read(path: str) -> tuple[dict[str, float], str]:
    """The seconds of ``path`` (a junit XML, or tests/durations.json) and how the report says where they are from."""
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        note = f" ({doc['note']})" if doc.get("note") else ""
        return ({k: float(v) for k, v in doc["seconds"].items()},
                f"From `{_shown(path)}`{note}, its items under 0.05 s left out")
    return from_junit(path), f"From `{_shown(path)}`, the junit XML of the last `make test`"


def _torch_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("torch").split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        return "none"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input", help="pytest's junit XML (--junitxml), or tests/durations.json")
    ap.add_argument("--torch", default=None, help="the torch release it ran on (default: the installed one)")
    ap.add_argument("-o", "--output", default=None,
                    help="default: reports/test-durations-cpu-torch<release>.md")
    args = ap.parse_args(argv)
    try:
        seconds, source = _read(args.input)
    except (OSError, ET.ParseError, ValueError, KeyError, TypeError) as e:
        print(f"error: {args.input}: {e}", file=sys.stderr)
        return 2
    if not seconds:
        print(f"error: no test durations in {args.input} (hint: run `make test` first)", file=sys.stderr)
        return 2
    torch = args.torch or _torch_version()
    out = args.output or os.path.join(ROOT, "reports", f"test-durations-cpu-torch{torch}.md")
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(render(seconds, source, torch))
    print(f"{_shown(out)}: {len(seconds)} items in {len(by_file(seconds))} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
