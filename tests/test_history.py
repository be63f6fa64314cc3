"""Commit subjects fit a line of `git log --oneline` and a mail's subject: each under 72 characters, from
FIRST_CHECKED on (the history before it is not judged); scripts/commit-msg, the hook `make hooks`
installs, refuses a longer one before it is made."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess

import pytest

from tests.conftest import ROOT

FIRST_CHECKED = "b437e07"
# two subjects made on a branch before the hook was there, merged since: history, not judged
MADE_BEFORE_THE_HOOK = {"59243b1a446da969493d2d317614a7db946dded2", "35967850b79b91f39dcc56d0c71dbdda0e7da4e8"}
LIMIT = 72
HOOK = os.path.join(ROOT, "scripts", "commit-msg")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def long_subjects(log: str) -> list[str]:
    """The lines of ``log`` (``git log --format='%h %s'``) whose subject is LIMIT characters or more."""
    return [line for line in log.splitlines() if len(line.split(" ", 1)[-1]) >= LIMIT]


def test_every_commit_subject_since_the_first_checked_is_under_72_characters():
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    top = _git("rev-parse", "--show-toplevel")
    if top.returncode != 0 or os.path.realpath(top.stdout.strip()) != os.path.realpath(ROOT):
        pytest.skip("not a git checkout of the project (a wheel or an sdist): no history to read")
    if _git("merge-base", "--is-ancestor", FIRST_CHECKED, "HEAD").returncode != 0:
        pytest.skip(f"{FIRST_CHECKED} is not in this clone's history (a shallow clone)")
    log = _git("log", "--format=%H %s", "HEAD", "--not", f"{FIRST_CHECKED}^@")
    assert log.returncode == 0, log.stderr
    assert log.stdout.strip(), "no commit from the first checked one on"
    assert [line for line in long_subjects(log.stdout) if line.split(" ", 1)[0] not in MADE_BEFORE_THE_HOOK] == []


def test_the_check_of_subjects_finds_a_long_one():
    assert long_subjects("abc1234 " + "x" * 71 + "\ndef5678 short\n") == []
    assert long_subjects("abc1234 " + "x" * 72 + "\ndef5678 short\n") == ["abc1234 " + "x" * 72]


@pytest.mark.parametrize("message, refused", [
    ("short subject\n\n" + "a body line longer than the limit " * 4 + "\n", False),
    ("x" * 71 + "\n", False),
    ("é" * 71 + "\n", False),  # characters, not bytes
    ("x" * 72 + "\n", True),
    ("# a comment git leaves out\n\n" + "y" * 80 + "\n", True),
    ("a subject written\nover two lines that git log shows as one line of " + "z" * 30 + "\n", True),
    ("fine\n# ------------------------ >8 ------------------------\n" + "w" * 90 + "\n", False),
])
def test_the_commit_msg_hook_refuses_a_subject_of_72_characters_or_more(tmp_path, message, refused):
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message, encoding="utf-8")
    assert runpy.run_path(HOOK, run_name="hook")["main"](str(path)) == (1 if refused else 0)
    r = subprocess.run([HOOK, str(path)], capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"))
    assert r.returncode == (1 if refused else 0) and ("keep it under 72" in r.stderr) == refused, r.stderr


def test_make_hooks_links_the_hook_that_refuses_a_long_subject(tmp_path):
    if shutil.which("git") is None or shutil.which("make") is None:
        pytest.skip("git and make are needed")
    repo = tmp_path / "clone"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "Makefile"), repo / "Makefile")
    shutil.copy(HOOK, repo / "scripts" / "commit-msg")
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.com", GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")

    def run(*argv):
        return subprocess.run(argv, cwd=repo, capture_output=True, text=True, env=env)

    assert run("git", "init", "-q").returncode == 0
    made = run("make", "-s", "hooks")
    assert made.returncode == 0 and os.path.islink(repo / ".git" / "hooks" / "commit-msg"), made.stderr
    refused = run("git", "commit", "-q", "--allow-empty", "-m", "s" * 72)
    assert refused.returncode != 0 and "keep it under 72" in refused.stderr
    assert run("git", "commit", "-q", "--allow-empty", "-m", "s" * 71).returncode == 0
