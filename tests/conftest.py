import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One content-keyed cache for the whole test session (and the next one).
os.environ.setdefault("TORCHGEN_PATCH_CACHE", os.path.join(ROOT, ".cache", "torchgen-patch"))
# C++ extensions built by tests and the libraries they drive (DeepSpeed's ops: the deepspeed_ops fixture),
# once per checkout.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(ROOT, ".cache", "torch_extensions"))
# The project's own builds treat every warning as an error (users' builds never do).
os.environ["TORCHGEN_PATCH_EXTRA_CFLAGS"] = "-Werror"
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from torchgen_patch import cli  # noqa: E402
from torchgen_patch.codegen import template_names  # noqa: E402
from torchgen_patch.plan import make_plan  # noqa: E402
from torchgen_patch.plan import overlay as ov  # noqa: E402
from torchgen_patch.scan import scan  # noqa: E402
from torchgen_patch.sources import Options, resolve  # noqa: E402
from tests.support import deepspeed_arch_list  # noqa: E402

# DeepSpeed reads TORCH_CUDA_ARCH_LIST in every process that loads one of its ops, the tests' own too
os.environ.update(deepspeed_arch_list())


@pytest.fixture(scope="session")
def default_scan():
    return scan(resolve(Options()))


@pytest.fixture(scope="session")
def default_overlay(default_scan):
    return ov.load(resolve(Options()), default_scan, template_names())


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
    """The full plan for the installed torch, compiled once per session (cached by content): the
    runtime's one composer, as every command gets it (runtime.Artifact)."""
    from torchgen_patch.runtime import library as compose

    return compose(Options(), plan=default_plan, prebuilt=False)


@pytest.fixture
def patched(library):
    """The compiled kernels installed for the duration of one test."""
    import torchgen_patch

    rep = torchgen_patch.install(library=library.path)
    assert not rep.refused, rep.summary()
    yield rep
    torchgen_patch.uninstall()


@pytest.fixture(scope="session")
def deepspeed_ops():
    """DeepSpeed's C++ ops that its CPU optimizers use (DeepSpeedCPUAdam, DeepSpeedCPUAdagrad,
    DeepSpeedCPULion, FusedAdam's CPU build: tests.support.DEEPSPEED_OPS), built once per session,
    side by side, into TORCH_EXTENSIONS_DIR (.cache/torch_extensions, kept between sessions), and
    started as soon as the session's tests are collected (pytest_collection_finish below); op ->
    its library. Skips where deepspeed is not installed, except in CI, which installs it."""
    from tests.support import DEEPSPEED_OPS, build_deepspeed_ops

    if os.environ.get("CI") == "true":  # requirements-dev.txt: never skip there
        import deepspeed  # noqa: F401
    else:
        pytest.importorskip("deepspeed")
    return build_deepspeed_ops(DEEPSPEED_OPS)


def pytest_collection_modifyitems(config, items):
    """Each item's marks from what it uses, how long it took and whether it is a sampled case
    (tests/tiers.py): `make check` leaves out the build, venv, sampled and slow ones by them."""
    from tests.tiers import load_durations, marks_for, sampled

    durations = load_durations()
    left = sampled(item.nodeid for item in items)
    for item in items:
        for name in marks_for(item, durations) + (["sampled"] if item.nodeid in left else []):
            item.add_marker(name)


def pytest_collection_finish(session):
    """DeepSpeed's ops start building as soon as the session knows that a test of it needs them
    (deepspeed_ops), so that they compile beside the tests that run first (a serial test run leaves
    one of two cores idle most of the time); the fixture then waits for what is left."""
    import importlib.util

    if session.config.option.collectonly or importlib.util.find_spec("deepspeed") is None:
        return
    if any("deepspeed_ops" in getattr(item, "fixturenames", ()) for item in session.items):
        from tests.support import DEEPSPEED_OPS, start_deepspeed_builds

        start_deepspeed_builds(DEEPSPEED_OPS)


def pytest_sessionfinish(session):
    """Builds a session started and no test waited for (a run stopped early) do not outlive it."""
    from tests.support import cancel_deepspeed_builds

    cancel_deepspeed_builds()
