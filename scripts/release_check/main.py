"""The composer: the steps asked for, run in order on a fresh tree in the venv of the release's time, each
one's results merged into the json as it ends, then the report and (with --report) the docs' table."""

from __future__ import annotations

import argparse
import json
import os
import sys

from testbed.debian_source import release_of
from testbed.release_inputs import Checked, Refused

from . import __doc__ as PACKAGE_DOC
from . import source
from .adapters import step_adapters
from .checkout import apply_fix, step_checkout
from .config import CACHE, REPORTS, ROOT, STEPS, TEST_GROUPS
from .groups import step_regression, step_tests
from .report import report_md, write_docs
from .store import atomic_write, save
from .venv import release_venv, torch_version
from .verdicts import defects


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=PACKAGE_DOC.split("\n\n")[0])
    ap.add_argument("--only", help=f"comma-separated steps or test groups to (re)run: {', '.join(STEPS)}")
    ap.add_argument("--report", action="store_true", help="write reports/ and docs/release-check.md (default: build/)")
    ap.add_argument("--render-only", action="store_true", help="run nothing; render the existing json again")
    ap.add_argument("--source-cache", default=CACHE, metavar="DIR",
                    help="where Debian's source package is cached (default: .cache/pytorch-src)")
    return ap


def _steps(only: str | None) -> list[str]:
    todo = only.split(",") if only else STEPS
    unknown = [s for s in todo if s not in STEPS]
    if unknown:
        sys.exit(f"error: unknown step {unknown[0]!r} (steps: {', '.join(STEPS)})")
    return todo


def _check(todo: list[str], got: Checked, release: str, json_path: str, seed: str) -> dict:
    """The steps of ``todo`` on a tree unpacked for this run (Refused when it cannot be); returns the
    results merged."""
    head = dict(release=release, tarball=os.path.basename(got.tarball), tarball_sha256=got.sha256)
    python = ""
    if set(todo) != {"checkout"}:  # the checkout step runs without torch: no venv of the release for it alone
        python = release_venv(release)
        head["torch"] = torch_version(python)
    data = save(json_path, seed, head)
    work = source.work_dir()
    tree = source.unpack(got, work)
    if "checkout" in todo:
        data = save(json_path, seed, {"checkout": step_checkout(tree, work, release)})
    if "checkout" not in todo or "failed" in data["checkout"]:  # the fix applied for what follows
        apply_fix(tree, work)
    for step in todo:
        print(f"{step} ...", file=sys.stderr)
        if step == "adapters":
            data = save(json_path, seed, {"adapters": step_adapters(tree, work, python)})
        elif step == "regression":
            data = save(json_path, seed, {"regression": step_regression(tree, work, python)})
        elif step in TEST_GROUPS:
            data = save(json_path, seed, {}, {step: step_tests(step, tree, work, python)})
    return data


def main() -> int:
    args = _parser().parse_args()
    todo = _steps(args.only)
    if os.geteuid() == 0 and not args.render_only:
        print("note: the release check runs the checked tree's own code (lintrunner init's init_commands, its "
              "codegen, its tests), here as root: run it in a throwaway container or as an unprivileged account "
              "(docs/release-check.md)", file=sys.stderr)
    try:
        got = source.fetch(args.source_cache, args.render_only)
    except Refused as e:
        print(f"error: no PyTorch source tree: {e}", file=sys.stderr)
        return e.exit_code
    release = release_of(got.tarball)
    out_dir = REPORTS if args.report else os.path.join(ROOT, "build")
    os.makedirs(out_dir, exist_ok=True)
    name = f"pytorch-own-{release}"
    json_path = os.path.join(out_dir, f"{name}.json")
    seed = json_path if os.path.isfile(json_path) else os.path.join(REPORTS, f"{name}.json")
    data = json.load(open(seed)) if os.path.isfile(seed) else {"tests": {}}
    if not args.render_only:
        try:
            data = _check(todo, got, release, json_path, seed)
        except Refused as e:  # only the unpacking refuses
            print(f"error: {e}", file=sys.stderr)
            return e.exit_code
    atomic_write(os.path.join(out_dir, f"{name}.md"), report_md(data))
    if args.report:
        write_docs(data)
    bad = defects(data)
    print(f"wrote {os.path.relpath(out_dir, ROOT)}/{name}.md: " + ("passes" if not bad else f"{len(bad)} open: "
                                                                   + "; ".join(bad[:3])), file=sys.stderr)
    return 0 if not bad else 1
