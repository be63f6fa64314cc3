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
    def path(self) -> str | None:
        """None: the location is unknown (an operator registered where this machine cannot see)."""
        return self.loc.path

    @property
    def line(self) -> int | None:
        return (self.loc.line or 1) if self.loc.path else None

    def sort_key(self) -> tuple:
        return (self.path or "", self.line or 0, self.op, self.rule)

    def to_json(self) -> dict:
        from ..errors import display_path

        return {"path": display_path(self.path) if self.path else None, "line": self.line, "op": self.op,
                "rule": self.rule,
                "message": self.message, "severity": self.severity, "code": self.code}
