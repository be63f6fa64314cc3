"""The size of C and C++ functions, for the architecture test's size rule: a small reader, not a parser.

It blanks comments, string and character literals (raw strings too) and preprocessor lines, matches
braces, and calls a function every brace block at the top level, in a namespace or ``extern "C"`` block,
or in a class, struct or union whose header looks like a function signature (a parenthesised parameter
list, no ``=`` outside parentheses, no control keyword). A lambda or any other block inside a function is
part of that function. A function's lines run from the first line of its header (its template line
included) to the line of its closing brace. Jinja tags are blanked first, so C++ templates are read too.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"^(if|for|while|switch|catch|do|else|try|return)\b")
_LABEL = re.compile(r"^(public|private|protected)\s*:(?!:)\s*")
_JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.S)


def _blank(text: str) -> str:
    return re.sub(r"[^\n]", " ", text)


def _raw_end(source: str, i: int) -> int | None:
    """The index past the raw string literal that starts at ``source[i]`` (an ``R"``), else None."""
    m = re.compile(r'R"([^()\\\s]{0,16})\(').match(source, i)
    if m is None:
        return None
    end = source.find(")" + m.group(1) + '"', m.end())
    return len(source) if end < 0 else end + len(m.group(1)) + 2


def _quoted_end(source: str, i: int) -> int:
    """The index past the string or character literal that starts at ``source[i]`` (its quote)."""
    quote, j = source[i], i + 1
    while j < len(source) and source[j] != quote and source[j] != "\n":
        j += 2 if source[j] == "\\" else 1
    return min(j + 1, len(source))


def clean(source: str) -> str:
    """``source`` with comments, literals' contents, preprocessor lines and Jinja tags blanked (newlines
    kept, so positions and line numbers stay); a string keeps its quotes (``extern "C"`` reads as
    ``extern " "``)."""
    source = _JINJA.sub(lambda m: _blank(m.group(0)), source)
    out, i, n, line_start = [], 0, len(source), True
    while i < n:
        c = source[i]
        if line_start and c == "#":  # a directive, with its continuation lines
            j = i
            while True:
                k = source.find("\n", j)
                k = n if k < 0 else k
                if k > 0 and source[k - 1] == "\\" and k < n:
                    j = k + 1
                    continue
                break
            out.append(_blank(source[i:k]))
            i = k
            continue
        if c in " \t":
            out.append(c)
            i += 1
            continue
        line_start = c == "\n"
        if source.startswith("//", i):
            k = source.find("\n", i)
            k = n if k < 0 else k
            out.append(_blank(source[i:k]))
            i = k
        elif source.startswith("/*", i):
            k = source.find("*/", i + 2)
            k = n if k < 0 else k + 2
            out.append(_blank(source[i:k]))
            i = k
        elif c == "R" and source.startswith('R"', i) and (i == 0 or not (source[i - 1].isalnum() or
                                                                           source[i - 1] == "_")):
            k = _raw_end(source, i)
            if k is None:
                out.append(c)
                i += 1
            else:
                out.append('"' + _blank(source[i + 1:k - 1])[1:] + ' "')
                i = k
        elif c == '"' or (c == "'" and not (i > 0 and source[i - 1].isalnum())):  # 1'000: a digit separator
            k = _quoted_end(source, i)
            closed = k - i >= 2 and source[k - 1] == c
            out.append(c + _blank(source[i + 1:k - 1]) + c if closed else c + _blank(source[i + 1:k]))
            i = k
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _balanced(text: str, i: int, open_: str, close: str) -> int:
    """The index past the ``close`` that matches the ``open_`` at ``text[i]``."""
    depth = 0
    for j in range(i, len(text)):
        depth += (text[j] == open_) - (text[j] == close)
        if depth == 0:
            return j + 1
    return len(text)


def _untemplate(header: str) -> str:
    """``header`` without its leading ``template <...>`` parts."""
    while True:
        m = re.match(r"\s*template\s*<", header)
        if m is None:
            return header.strip()
        header = header[_balanced(header, m.end() - 1, "<", ">"):]


def _collapse(header: str) -> str:
    """``header`` with what its parentheses enclose left out (``f(int a)`` reads ``f()``)."""
    out, depth = [], 0
    for c in header:
        if c == "(":
            depth += 1
            if depth == 1:
                out.append("(")
        elif c == ")":
            depth = max(depth - 1, 0)
            if depth == 0:
                out.append(")")
        elif depth == 0:
            out.append(c)
    return "".join(out)


def _kind(header: str) -> str:
    """What the brace after ``header`` opens: "function", "container" (a namespace, linkage block, class,
    struct or union: its functions are counted) or "other" (an initializer, an enum: skipped whole)."""
    h = _untemplate(_LABEL.sub("", header.strip()))
    if re.match(r'((inline\s+)?namespace\b|extern\s*"\s*"\s*$)', h):
        return "container"
    if re.match(r"(class|struct|union)\b", h) and "(" not in h:
        return "container"
    if not h or re.match(r"enum\b", h) or _CONTROL.match(h) or "(" not in h:
        return "other"
    outside = re.sub(r"\boperator\s*(\(\)|[^\s(]+)", "operator", _collapse(h))
    return "other" if "=" in outside else "function"


def _signature(header: str) -> str:
    """``header`` without a constructor's member initializer list."""
    depth = 0
    for j, c in enumerate(header):
        depth += (c == "(") - (c == ")")
        if c == ")" and depth == 0 and re.match(r"\s*(noexcept\s*)?:(?!:)", header[j + 1:]):
            return header[:j + 1]
    return header


def _name(header: str) -> str:
    """The function's name: the identifier before the last parenthesised group of its signature."""
    flat = re.sub(r"\boperator\s*\(\)", "operator_call", _collapse(_untemplate(_signature(header))))
    names = re.findall(r"([~\w:]+)\s*\(\)", flat)
    return names[-1].replace("operator_call", "operator()") if names else flat.split()[0]


def _init_list(header: str) -> bool:
    """Whether ``header`` is a constructor's signature in the middle of its member initializer list (the
    brace that follows initializes a member)."""
    flat = _collapse(header)
    return bool(re.search(r"\)\s*(noexcept\s*)?:(?!:)", flat)) and bool(re.search(r"[\w>]\s*$", flat))


def functions(source: str) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function of ``source``, in order."""
    text = clean(source)
    found: list[tuple[str, int, int]] = []
    line_of = [0] * (len(text) + 1)
    ln = 1
    for i, c in enumerate(text):
        line_of[i] = ln
        if c == "\n":
            ln += 1
    line_of[len(text)] = ln

    def scan(i: int, end_at_close: bool) -> int:
        start = i
        while i < len(text):
            c = text[i]
            if c == ";":
                start = i + 1
            elif c == "}":
                if end_at_close:
                    return i + 1
                start = i + 1
            elif c == "{":
                header = text[start:i]
                if _init_list(header):
                    i = _balanced(text, i, "{", "}")
                    continue
                kind = _kind(header)
                if kind == "container":
                    i = scan(i + 1, True)
                    start = i
                    continue
                end = _balanced(text, i, "{", "}")
                if kind == "function":
                    first = start + len(header) - len(header.lstrip())
                    label = _LABEL.match(header.lstrip())
                    if label:
                        rest = header.lstrip()[label.end():]
                        first = i - len(rest) + (len(rest) - len(rest.lstrip()))
                    found.append((_name(header), line_of[first], line_of[end - 1] - line_of[first] + 1))
                i = start = end
                continue
            i += 1
        return i

    scan(0, False)
    return found
