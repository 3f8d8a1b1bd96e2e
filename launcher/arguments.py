"""The command line's argument types: each refuses a value outside its rule as a usage error
(exit 2, naming the flag and the rule) before anything starts. For `serve`'s flags the rules are
the services' own (their settings' bounds); tests/launcher/test_arguments.py holds the two equal."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from gateway.tenants import (
    HIGHEST_PRIORITY,
    LOWEST_PRIORITY,
    TARGET_MAX_MS,
    TENANT_ID,
    TENANT_RULE,
    valid_target_ms,
)
from workers.manager.config import DEVICE

Parse = Callable[[str], object]
TRUE, FALSE = ("1", "on", "t", "true", "y", "yes"), ("0", "off", "f", "false", "n", "no")


def bounded(kind: type[int] | type[float], least: float, most: float | None = None, *,
            above: bool = False, what: str = "") -> Parse:
    """An int or a float of least..most (above: greater than least, not equal); what names
    it in the error ("a port")."""
    rule = (f"above {least:g}" if above else f"at least {least:g}") if most is None \
        else f"{least:g}..{most:g}"
    if above and most is not None:
        rule = f"between {least:g} and {most:g}, both excluded"
    noun = what or ("an integer" if kind is int else "a number")
    says = f"{noun} is {rule}" if what else f"{noun} {rule}"

    def parse(text: str) -> int | float:
        try:
            value = (_integer if kind is int else float)(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{says}, not {text!r}") from None
        low = value > least if above else value >= least
        high = most is None or (value < most if above else value <= most)
        if math.isnan(value) or not (low and high):
            raise argparse.ArgumentTypeError(f"{says}, not {text}")
        return value

    return parse


def _integer(text: str) -> int:
    """An int, also written with a zero fraction ("2.0"), as the services' settings take it."""
    whole, point, fraction = text.partition(".")
    if point and fraction and not fraction.strip("0"):
        return int(whole)
    return int(text)


def one_of(*choices: str) -> Parse:
    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"one of {', '.join(choices)}: not {text!r}")
        return text

    return parse


def boolean(text: str) -> str:
    """true or false, as the services' settings read them (also 1/0, yes/no, on/off)."""
    if text.lower() not in TRUE + FALSE:
        raise argparse.ArgumentTypeError(f"true or false, not {text!r}")
    return text


def device(text: str) -> str:
    if not re.fullmatch(DEVICE, text):
        raise argparse.ArgumentTypeError(f"cpu or cuda[:N], not {text!r}")
    return text


def tenant_id(text: str) -> str:
    if not TENANT_ID.fullmatch(text):
        raise argparse.ArgumentTypeError(f"a tenant id uses {TENANT_RULE}: not {text!r}")
    return text


def target_ms(text: str) -> float:
    value = float(text)
    if not valid_target_ms(value):
        raise argparse.ArgumentTypeError(f"a latency target is 0..{TARGET_MAX_MS} ms")
    return value


port = bounded(int, 0, 65535, what="a port")
priority = bounded(int, LOWEST_PRIORITY, HIGHEST_PRIORITY, what="a priority")
positive = bounded(int, 1)
