"""A settings object's command line, generated from its fields."""

from __future__ import annotations

import argparse
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from wire.flags import add_flags, given


class Settings(BaseModel):
    model: str = Field("tiny", description="the model")
    threads: int | None = Field(None, description="threads")
    wait_ms: float = Field(2.0, ge=0, description="a wait")
    policy: Literal["eager", "lockstep"] = "eager"
    fuse: bool = True
    secret: str | None = None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="p")
    add_flags(p, Settings, skip=("secret",))
    return p


def test_every_field_is_a_flag_typed_as_the_field() -> None:
    args = parser().parse_args(["--threads", "3", "--wait-ms", "0.5", "--policy", "lockstep",
                                "--no-fuse"])
    assert given(args, Settings) == {"threads": 3, "wait_ms": 0.5, "policy": "lockstep",
                                     "fuse": False}
    assert Settings(**given(args, Settings)).fuse is False
    assert given(parser().parse_args([]), Settings) == {}  # unset flags leave the defaults


def test_help_comes_from_the_description_and_secrets_are_no_flags(capsys) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["--help"])
    text = capsys.readouterr().out
    assert "--wait-ms WAIT_MS" in text and "a wait" in text and "--fuse, --no-fuse" in text
    assert "--secret" not in text
    with pytest.raises(SystemExit):
        parser().parse_args(["--policy", "sometimes"])
