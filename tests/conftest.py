import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One content-keyed cache for the whole test session (and the next one).
os.environ.setdefault("TORCHGEN_PATCH_CACHE", os.path.join(ROOT, ".cache", "torchgen-patch"))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from torchgen_patch import cli, load  # noqa: E402
from torchgen_patch import overlay as ov  # noqa: E402
from torchgen_patch.plan import make_plan  # noqa: E402
from torchgen_patch.render import template_names  # noqa: E402


def torch_is(prefix: str) -> bool:
    return load.torch_version().startswith(prefix)


@pytest.fixture(scope="session")
def default_scan():
    return load.scan(load.Sources.resolve())


@pytest.fixture(scope="session")
def default_overlay(default_scan):
    return ov.load(ov.default_path(), default_scan, template_names())


@pytest.fixture(scope="session")
def default_plan(default_scan, default_overlay):
    return make_plan(default_scan, default_overlay)


@pytest.fixture
def run_cli(capsys):
    """Run the CLI in-process: (exit code, stdout, stderr)."""

    def run(*argv):
        rc = cli.main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return rc, out, err

    return run


@pytest.fixture(scope="session")
def library(default_plan):
    """The full plan for the installed torch, compiled once per session (cached by content)."""
    from torchgen_patch.build import build
    from torchgen_patch.render import render

    files = render(default_plan, 2)
    return build(files, default_plan.ops(), 2)


@pytest.fixture
def patched(library):
    """The compiled kernels installed for the duration of one test."""
    import torchgen_patch

    rep = torchgen_patch.install(library=library.path)
    assert not rep.refused, rep.summary()
    yield rep
    torchgen_patch.uninstall()
