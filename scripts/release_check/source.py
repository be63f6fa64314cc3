"""The tree: Debian's source package `pytorch`, fetched with apt into the cache (testbed/debian_source.py),
used only as its pins vouch for it (testbed/release_inputs.py), and unpacked fresh, under git, for each run
into a folder of its own under build/pytorch-check/."""

from __future__ import annotations

import os
import sys
import tempfile

from testbed.debian_source import fetch_source, tree_from_source
from testbed.release_inputs import Checked

from .config import ROOT


def fetch(cache: str, render_only: bool) -> Checked:
    """The checked source package (Refused, one line, when none is to be had); what the cache held and the
    pins did not vouch for is noted. Closed at once when nothing is to be unpacked."""
    got = fetch_source(cache)
    for why in got.refused:
        print(f"note: not used: {why}", file=sys.stderr)
    if render_only:
        got.close()
    return got


def work_dir() -> str:
    """A new folder for one run, under build/pytorch-check/."""
    os.makedirs(os.path.join(ROOT, "build", "pytorch-check"), exist_ok=True)
    return tempfile.mkdtemp(prefix="run-", dir=os.path.join(ROOT, "build", "pytorch-check"))


def unpack(got: Checked, work: str) -> str:
    """The tree unpacked from the checked descriptors into work/pytorch (Refused, one line, when it cannot be)."""
    print(f"unpacking {os.path.basename(got.tarball)} into {os.path.relpath(work, ROOT)}", file=sys.stderr)
    with got:
        return tree_from_source(got, os.path.join(work, "pytorch"))
