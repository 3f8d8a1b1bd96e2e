"""A process's command line generated from its settings object: one `--field-name` flag per
field (its description the help), parsed back into the settings on top of the environment.
Nothing is listed twice, so a new setting is a flag at once."""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel


def add_flags(parser: argparse.ArgumentParser, settings: type[BaseModel],
              skip: Iterable[str] = ()) -> None:
    for name, field in settings.model_fields.items():
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        kind, choices = _scalar(field.annotation)
        options: dict[str, Any] = {"default": None, "dest": name, "help": field.description}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif choices:
            options["choices"] = choices
        elif kind in (int, float):
            options["type"] = kind
        parser.add_argument(flag, **options)


def given(args: argparse.Namespace, settings: type[BaseModel]) -> dict[str, Any]:
    """The flags given on the command line, as settings fields (the rest stays as the
    environment and the defaults say)."""
    return {name: value for name, value in vars(args).items()
            if name in settings.model_fields and value is not None}


def _scalar(annotation: Any) -> tuple[type | None, tuple | None]:
    """(int, float, bool or str; the Literal's choices) of a field's type, None made optional."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)] \
        if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is \
        typing.Union else [annotation]
    inner = args[0] if len(args) == 1 else str
    if typing.get_origin(inner) is Literal:
        return str, typing.get_args(inner)
    return (inner if inner in (int, float, bool, str) else str), None
