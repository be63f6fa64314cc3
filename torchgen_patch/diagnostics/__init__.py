"""Diagnostics as data: a ``Finding`` per problem, made by one function per rule
(``rules``), rendered by one renderer per format (``render``). The CLI alone
decides printing and exit codes."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import Location

CODE = "VERSIONCOUNTER"


@dataclass(frozen=True)
class Finding:
    loc: Location
    op: str
    rule: str
    message: str
    severity: str = "error"
    code: str = CODE

    @property
    def path(self) -> str:
        return self.loc.path

    @property
    def line(self) -> int:
        return self.loc.line or 1

    def sort_key(self) -> tuple:
        return (self.path, self.line, self.op, self.rule)

    def to_json(self) -> dict:
        from ..errors import display_path

        return {"path": display_path(self.path), "line": self.line, "op": self.op, "rule": self.rule,
                "message": self.message, "severity": self.severity, "code": self.code}
