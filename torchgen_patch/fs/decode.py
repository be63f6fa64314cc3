"""JSON whose every failure is a ``ValueError``, for what a lease, an entry or any input holds."""

from __future__ import annotations

MAX_JSON_DEPTH = 64  # the tool's own JSON nests 4 levels; named where a document nests too deeply to decode


def loads(data: bytes | str):
    """``json.loads`` whose every failure is a ``ValueError`` (a ``json.JSONDecodeError`` with the line):
    a document nested deeper than the decoder's recursion allows (``[[[[...``, 100,000 deep) is one too,
    at the line where it passes MAX_JSON_DEPTH levels, never a RecursionError."""
    import json

    try:
        return json.loads(data)
    except RecursionError:
        pass
    import re

    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    depth, pos = 0, 0
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]', text):
        if m.group() in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                pos = m.start()
                break
        elif m.group() in "]}":
            depth -= 1
    raise json.JSONDecodeError(f"nested more than {MAX_JSON_DEPTH} levels deep", text, pos) from None
