"""``torchgen-patch findings``'s renderers, one per format of its report (text for a terminal, markdown
for people, JSON for programs). Each takes the grouped ``Report`` (``fleet.py``) and returns text; the
CLI says the skipped lines and decides the exit code."""

from __future__ import annotations

import dataclasses
import json

from ..errors import printable
from ..saved import render as saved
from ..saved.finding import Frame
from ..vocabulary import Format, plural
from .fleet import Report, Site

JSON_SCHEMA_VERSION = 1
TITLE = "Saved tensors written behind autograd's back"


def ranges(ranks: tuple[int, ...]) -> str:
    """Ranks as runs: ``0-3, 7, 9-10`` (a thousand ranks stay one short line when they are all there)."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _hosts(hosts: tuple[str, ...]) -> str:
    named = ", ".join(printable(h) for h in hosts[:3])
    return plural(len(hosts), "host") + (f" ({named}{', ...' if len(hosts) > 3 else ''})" if hosts else "")


def _who(processes: int, hosts: tuple[str, ...], ranks: tuple[int, ...]) -> str:
    """``2 processes on 1 host (vm), ranks 0-1``."""
    return f"{plural(processes, 'process', 'processes')} on {_hosts(hosts)}" + \
        (f", {plural(len(ranks), 'rank')} ({ranges(ranks)})" if ranks else "")


def _steps(s: Site) -> str:
    if s.first_step is None:
        return "outside a backward pass"
    if s.steps == 1:
        return f"at step {s.first_step}"
    return f"at {s.steps} steps (first {s.first_step}, last {s.last_step})"


def _frame(fr: Frame | None) -> str:
    return printable(fr.render()) if fr else "an unknown frame"


MOST_TENSORS = 3  # tensors a site lists for people (a loop over a model's layers saves one a layer there)


def tensors(s: Site) -> tuple[list[str], str]:
    """The site's tensors for people: the first few, and how many more ("" for none; JSON lists them all)."""
    more = len(s.tensors) - MOST_TENSORS
    shown = [saved.tensor(f) for f in s.tensors[:MOST_TENSORS]]
    return shown, f"and {plural(more, 'other tensor')}" if more > 0 else ""


def likely_writer(s: Site) -> str:
    """The most likely writer of the site's tensors, as the check's own line says it."""
    f = s.likely
    return saved.writers(dataclasses.replace(f, writers=f.writers[:1])) if f.writers else "unknown"


def _headline(r: Report) -> str:
    if not r.sites:
        return f"no saved tensor was written behind autograd's back: no finding in {plural(r.files, 'file')}"
    return (f"{plural(len(r.sites), 'site')}, {plural(r.findings, 'finding')} from "
            f"{_who(r.processes, r.hosts, r.ranks)}; {plural(r.files, 'file')} read"
            + (f", {plural(len(r.problems), 'file or line', 'files or lines')} skipped" if r.problems else ""))


def text(r: Report) -> str:
    """For a terminal: a headline, then a paragraph per site."""
    lines = [f"torchgen-patch findings: {_headline(r)}"]
    for n, s in enumerate(r.sites, 1):
        saver = printable(s.node or "an unknown node")
        lines += ["", f"{n}. saved by {saver} in the forward call at {_frame(s.forward)}",
                  f"   found by {_who(s.processes, s.hosts, s.ranks)}, {_steps(s)}: "
                  f"{plural(s.findings, 'finding')}"]
        shown, more = tensors(s)
        lines += [f"   tensor:  {t}" for t in shown] + ([f"            {more}"] if more else [])
        lines += [f"   used by: the backward call at {_frame(b)}" for b in s.backward]
        lines.append(f"   likely written by: {likely_writer(s)}")
    return "\n".join(lines) + "\n"


def _cell(value: str) -> str:
    """Text in a markdown table's cell: on one line, its pipes escaped, no HTML (the names are input)."""
    return printable(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def _code(value: str) -> str:
    """Text as code in a cell (literal there: only its pipes escaped, a backtick made a quote)."""
    return "`" + printable(value).replace("`", "'").replace("|", "\\|") + "`"


def markdown(r: Report) -> str:
    """For people: a table with a row per site."""
    out = [f"# {TITLE}", "", _headline(r)[:1].upper() + _headline(r)[1:] + ".", ""]
    if r.sites:
        out += ["| # | saved by | forward call | processes | ranks | steps | first step | findings | tensor "
                "| likely written by |", "|---:|---|---|---:|---|---:|---:|---:|---|---|"]
    for n, s in enumerate(r.sites, 1):
        shown, more = tensors(s)
        cells = [str(n), _code(s.node or "unknown"), _code(s.forward.render()) if s.forward else "unknown",
                 str(s.processes), ranges(s.ranks) or "-", str(s.steps), "-" if s.first_step is None else
                 str(s.first_step), str(s.findings), "<br>".join(_cell(t) for t in [*shown, more] if t),
                 _cell(likely_writer(s))]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _site_dict(s: Site) -> dict:
    def frame(fr):
        return None if fr is None else {"file": fr.file, "line": fr.line, "function": fr.function}

    tensors = [{k: v for k, v in saved.as_dict(f)["tensor"].items() if k != "version"} for f in s.tensors]
    return {"saved_by": s.node, "forward": frame(s.forward), "findings": s.findings, "processes": s.processes,
            "hosts": list(s.hosts), "ranks": list(s.ranks), "steps": s.steps, "first_step": s.first_step,
            "last_step": s.last_step, "tensors": tensors, "backward": [frame(b) for b in s.backward],
            "writers": [str(w) for w in s.likely.writers], "optimizer": s.likely.optimizer,
            "triton_kernel": saved.kernel(s.likely)}


def to_json(r: Report) -> str:
    """For programs: every site, with the totals and what was skipped (its count; the lines said it)."""
    return json.dumps({"schema_version": JSON_SCHEMA_VERSION, "sites": [_site_dict(s) for s in r.sites],
                       "findings": r.findings, "processes": r.processes, "hosts": list(r.hosts),
                       "ranks": list(r.ranks), "files": r.files, "skipped": len(r.problems)},
                      indent=2, sort_keys=True) + "\n"


RENDERERS = {Format.TEXT: text, Format.MARKDOWN: markdown, Format.JSON: to_json}
