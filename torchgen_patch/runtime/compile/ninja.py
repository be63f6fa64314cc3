"""The build.ninja of a build (relative paths only) and what ninja's log says each output took."""

from __future__ import annotations

import os

from ...errors import EnvironmentProblem
from ...fs.dirs import Dir
from ...fs.protected import Missing


def _ninja_quote(words: list[str]) -> str:
    import shlex

    return " ".join(shlex.quote(w) for w in words).replace("$", "$$")


def build_ninja(compiler: str, cflags: list[str], ldflags: list[str], units: list[str], library: str) -> str:
    """A build.ninja of relative paths only (``src/<unit>`` → ``<unit>.o`` → ``library``): run in its
    directory, the build resolves no name outside it but the toolchain's."""
    objects = [os.path.splitext(u)[0] + ".o" for u in units]
    lines = ["ninja_required_version = 1.3", f"cxx = {_ninja_quote([compiler])}", f"cflags = {_ninja_quote(cflags)}",
             f"ldflags = {_ninja_quote(ldflags)}", "",
             "rule compile", "  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out", "  depfile = $out.d",
             "  deps = gcc", "  description = compile $in", "",
             "rule link", "  command = $cxx $in $ldflags -o $out", "  description = link $out", ""]
    lines += [f"build {o}: compile src/{u}" for u, o in zip(units, objects, strict=True)]
    lines += [f"build {library}: link {' '.join(objects)}", f"default {library}", ""]
    return "\n".join(lines)


def ninja_times(d: Dir) -> dict[str, float]:
    """Each output's own build time in seconds, from ninja's log in ``d`` (``.ninja_log``)."""
    try:
        text = d.read(".ninja_log").decode(errors="replace")
    except (Missing, EnvironmentProblem, OSError):
        return {}
    out = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
            out[parts[3]] = round((int(parts[1]) - int(parts[0])) / 1000, 1)
    return out


