"""A store command refused: the HTTP status, code and message its answer carries."""

from __future__ import annotations


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code
