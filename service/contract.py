"""The rules of the request fields, stated once: as JSON Schema for the document, and as
the validators that enforce exactly that schema.

One matching rule for every choice (tier, GPU name, preset name, every workload
choice): a string names a choice when, with spaces, tabs and line breaks around it
removed, it equals one of the documented names with ASCII letters compared without
case.  The document says so with a `pattern` built from the same names, so a client
(or a fuzzer) that follows the pattern is never refused, and anything else is.

The names and bounds come from ckpt_core's constants; a value that passes here is
handed to ckpt_core in its canonical spelling, and ckpt_core's own checks (with their
messages and fields) still run.  Where this layer refuses a value it raises the
ckpt_core error ckpt_core would raise for it, so the answer's ``error`` code is the
same whichever layer spoke.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, Final

from ckpt_core import (
    GPUS,
    MAX_GPU_MEMORY_GB,
    MIN_TRANSFORMERS,
    TIER_SYNONYMS,
    InvalidGpuMemoryError,
    UnsupportedTransformersVersionError,
    list_presets,
)

# What "trimmed" removes: the whitespace JSON itself knows.
TRIMMED: Final = " \t\n\r"
_SPACE: Final = "[ \\t\\n\\r]*"
_META: Final = frozenset(".^$*+?()[]{}|\\/")

CHOICE_RULE: Final = (
    "Trimmed (spaces, tabs, line breaks) and ASCII case-insensitive, as the pattern states."
)


def _letters(word: str) -> str:
    """`word` as a regex matching it with ASCII letters in either case."""
    parts = []
    for char in word:
        if char.isascii() and char.isalpha():
            parts.append(f"[{char.upper()}{char.lower()}]")
        elif char in _META:
            parts.append("\\" + char)
        else:
            parts.append(char)
    return "".join(parts)


def choice_pattern(words: Iterable[str]) -> str:
    """The JSON Schema ``pattern`` of the choice rule for `words`."""
    alternatives = "|".join(_letters(w) for w in sorted(set(words), key=lambda w: (-len(w), w)))
    return f"^{_SPACE}(?:{alternatives}){_SPACE}$"


class Choice:
    """A set of names under the choice rule: its pattern, and the canonical name of a value."""

    def __init__(self, words: Iterable[str]) -> None:
        self.words = tuple(words)
        self.pattern = choice_pattern(self.words)
        self._regex = re.compile(self.pattern)
        self._canonical = {w.lower(): w for w in self.words}

    def canonical(self, value: object) -> str | None:
        """The documented name `value` stands for, or None when it names none."""
        if not isinstance(value, str) or self._regex.search(value) is None:
            return None
        return self._canonical[value.strip(TRIMMED).lower()]

    def schema(self, **extra: Any) -> dict[str, Any]:
        return {"type": "string", "pattern": self.pattern, **extra}


TIER_CHOICE: Final = Choice(TIER_SYNONYMS)
GPU_CHOICE: Final = Choice(name for spec in GPUS for name in (spec.name, *spec.aliases))
PRESET_CHOICE: Final = Choice(preset.name for preset in list_presets())


def choice_validator(
    choice: Choice,
    refuse: Callable[[object], object],
    nullable: bool = False,
    error: Callable[..., Exception] | None = None,
    field: str | None = None,
) -> Callable[[Any], Any]:
    """A pydantic before-validator: the canonical name, else `refuse(value)`'s error.

    `refuse` is the ckpt_core check for the field (its message lists the names);
    a value it would still accept (Unicode case folding, say) is outside the rule
    all the same, and refused here - as `error` (a ckpt_core error class, so the
    answer's code is the field's usual one) when given.
    """

    def validate(value: Any) -> Any:
        if value is None and nullable:
            return None
        canonical = choice.canonical(value)
        if canonical is not None:
            return canonical
        refuse(value)
        problem = type_error(value, choice)
        if error is not None:
            raise error(str(problem), field=field)
        raise problem

    return validate


class ChoiceError(ValueError):
    """A string outside the choice rule that ckpt_core alone would have taken."""


def type_error(value: object, choice: Choice) -> ChoiceError:
    return ChoiceError(
        f"{value!r} is not one of {', '.join(repr(w) for w in choice.words)} "
        "(trimmed, ASCII case-insensitive)"
    )


# --- cross-field rules ----------------------------------------------------------------


class Allowed:
    """One case a cross-field rule allows: each named field's choices (a set of names,
    under the choice rule) or its JSON Schema (a dict); fields not named are free."""

    def __init__(self, required: Sequence[str] = (), **fields: Collection[str] | Mapping[str, Any]):
        self.required = tuple(required)
        self.fields = {
            name: dict(value) if isinstance(value, Mapping) else frozenset(value)
            for name, value in fields.items()
        }


def _merged(cases: Iterable[Allowed]) -> Allowed | None:
    """The case all of `cases` allow at once; None when no value does."""
    fields: dict[str, frozenset[str] | dict[str, Any]] = {}
    required: list[str] = []
    for case in cases:
        for name, value in case.fields.items():
            known = fields.get(name, value)
            if isinstance(known, frozenset) and isinstance(value, frozenset):
                fields[name] = known & value
                if not fields[name]:
                    return None
            elif known != value:
                raise ValueError(f"{name}: cannot intersect {known!r} and {value!r}")
            else:
                fields[name] = value
        required += [name for name in case.required if name not in required]
    return Allowed(required, **fields)


def combinations(*groups: Sequence[Allowed], nullable: Collection[str] = ()) -> dict[str, Any]:
    """JSON Schema allowing exactly one case of every group at once: an anyOf of their
    products (cases no value meets are left out); `nullable` fields also take null."""
    branches = []
    for cases in itertools.product(*groups):
        case = _merged(cases)
        if case is None:
            continue
        properties = {}
        for name, value in case.fields.items():
            schema = Choice(sorted(value)).schema() if isinstance(value, frozenset) else value
            properties[name] = {"anyOf": [schema, {"type": "null"}]} if name in nullable else schema
        branch: dict[str, Any] = {"properties": properties}
        if case.required:
            branch["required"] = list(case.required)
        branches.append(branch)
    return {"anyOf": branches}


# --- GPU memory --------------------------------------------------------------------

GPU_MEMORY_SCHEMA: Final = {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_GPU_MEMORY_GB}


def gpu_memory(value: Any) -> Any:
    """GiB: a JSON number (not a boolean), finite, > 0, <= the largest GPU; None passes."""
    if value is None:
        return None
    number = not isinstance(value, bool) and isinstance(value, int | float)
    if not number or not math.isfinite(value) or not 0 < value <= MAX_GPU_MEMORY_GB:
        raise InvalidGpuMemoryError(
            f"gpu_memory_gb must be a number of GiB, > 0 and <= {MAX_GPU_MEMORY_GB:g}, "
            f"got {value!r}",
            field="gpu_memory_gb",
        )
    return value


# --- transformers versions -----------------------------------------------------------

_NUMBER: Final = "(?:0|[1-9][0-9]*)"
_PRE_RELEASE: Final = "(?:[.-]?(?:dev|a|b|rc)[0-9]*)"
_FINAL_SUFFIX: Final = "(?:\\.post[0-9]+)?(?:\\+[A-Za-z0-9]+(?:\\.[A-Za-z0-9]+)*)?"


def _greater_than(n: int) -> str:
    """A regex for the integers > `n` (no leading zeros)."""
    digits = str(n)
    options = [f"[1-9][0-9]{{{len(digits)},}}"]  # more digits
    for i, digit in enumerate(digits):
        if digit == "9":
            continue
        low = int(digit) + 1
        rest = len(digits) - i - 1
        head = digits[:i]
        options.append(f"{head}[{low}-9]" + (f"[0-9]{{{rest}}}" if rest else ""))
    return "(?:" + "|".join(options) + ")"


def version_pattern(minimum: tuple[int, int, int]) -> str:
    """Release versions >= `minimum` (``5.24.0``, ``4.57``, ``5.23.0.dev0``, ``5.1.0+local``).

    A pre-release counts as the release before it (ckpt_core's rule), so a
    pre-release of `minimum` itself is below it and does not match.
    """
    major, minor, patch = minimum
    newer = [
        f"{_greater_than(major)}\\.{_NUMBER}(?:\\.{_NUMBER})?",
        f"{major}\\.{_greater_than(minor)}(?:\\.{_NUMBER})?",
    ]
    if patch:
        newer.append(f"{major}\\.{minor}\\.{_greater_than(patch)}")
        exact = f"{major}\\.{minor}\\.{patch}"
    else:
        newer.append(f"{major}\\.{minor}\\.{_greater_than(0)}")
        exact = f"{major}\\.{minor}(?:\\.0)?"
    later = "(?:" + "|".join(newer) + f"){_PRE_RELEASE}?{_FINAL_SUFFIX}"
    return f"^(?:{later}|{exact}{_FINAL_SUFFIX})$"


VERSION_PATTERN: Final = version_pattern(MIN_TRANSFORMERS)
_VERSION: Final = re.compile(VERSION_PATTERN)
_MINIMUM_TEXT: Final = ".".join(map(str, MIN_TRANSFORMERS))


def transformers_version(value: Any) -> Any:
    """A version string ckpt_core can plan for; None passes (the installed version)."""
    if value is None:
        return None
    if isinstance(value, str) and _VERSION.search(value) is not None:
        return value
    raise UnsupportedTransformersVersionError(
        f"transformers_version must be a release version >= {_MINIMUM_TEXT} such as "
        f"'5.24.0' (optionally .devN / rcN / .postN / +local), got {value!r}",
        field="transformers_version",
    )
