"""A method's hyperparameters: declared once as dataclass fields, checked from their declaration.

    @dataclass
    class FedTGPOptions:
        lam: float = option(1.0, "weight of the MSE pull", ">= 0")
        eval_mode: str = option("head", "head or prototype", choices=("head", "prototype"))

``option`` records the help text, a range (``"> 0"``, ``">= 1"``, ``"(0, 1]"``, ``"[0, 1)"``)
and the allowed values (a tuple, or a function returning them for registries filled later).
`resolve_options` coerces CLI strings to each field's type, checks every declared range and
choice (``None`` means "unset" and is never checked), then calls the Options' own
``validate()`` where a rule ties several fields together. Every failure is one sentence
naming the field, its value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import operator
import typing
from collections.abc import Callable, Sequence
from typing import Any

from fedtsp.core.config import ConfigError

Choices = Sequence[str] | Callable[[], Sequence[str]]
_COMPARE = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def option(default: Any, help: str, bounds: str | None = None, choices: Choices = ()) -> Any:
    """A documented, checked option field: ``lam: float = option(1.0, "weight of ...", ">= 0")``."""
    if bounds is not None:
        _parse_bounds(bounds)  # a malformed range fails when the method is defined
    return dataclasses.field(
        default=default, metadata={"help": help, "bounds": bounds, "choices": choices}
    )


def _parse_bounds(bounds: str) -> list[tuple[Callable[[Any, Any], bool], float]]:
    """``"> 0"`` -> [(gt, 0)]; ``"(0, 1]"`` -> [(gt, 0), (le, 1)]."""
    text = bounds.strip()
    if text[0] in "([" and text[-1] in ")]":
        low, high = (float(part) for part in text[1:-1].split(","))
        lower = operator.gt if text[0] == "(" else operator.ge
        upper = operator.lt if text[-1] == ")" else operator.le
        return [(lower, low), (upper, high)]
    op, _, value = text.partition(" ")
    if op not in _COMPARE:
        raise ValueError(
            f"option bounds {bounds!r}: write '> x', '>= x', '< x', '<= x' or '(a, b]'"
        )
    return [(_COMPARE[op], float(value))]


def check_declared(options: Any) -> None:
    """Raise ValueError for the first field outside its declared range or choices."""
    for field in dataclasses.fields(options):
        meta = field.metadata
        _check_field(
            field.name, getattr(options, field.name), meta.get("bounds"), meta.get("choices")
        )


def _check_field(name: str, value: Any, bounds: str | None, choices: Choices | None) -> None:
    if value is None:
        return
    if bounds is not None and not all(ok(value, ref) for ok, ref in _parse_bounds(bounds)):
        where = f"in {bounds}" if bounds.strip()[0] in "([" else bounds
        raise ValueError(f"{name}={value!r} is invalid; must be {where}")
    allowed = choices() if callable(choices) else choices or ()
    if allowed and value not in allowed:
        raise ValueError(f"{name}={value!r} is invalid; choose one of {', '.join(allowed)}")


def check_value(
    name: str, value: Any, annotation: Any, bounds: str | None = None, choices: Choices = ()
) -> Any:
    """One option value as `build_options` takes it: coerced to `annotation` and checked
    against its range and choices (ValueError), without the Options class itself (the
    command line's early check, from `fedtsp.catalogue`)."""
    value = _coerce(value, annotation, name)
    _check_field(name, value, bounds, choices)
    return value


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    """Turn CLI strings into the option's declared type (bool, int, float, str, optional)."""
    args = typing.get_args(annotation)
    if type(None) in args:
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return None
        annotation = next(a for a in args if a is not type(None))
    if isinstance(value, str) and annotation is not str:
        if annotation is bool:
            low = value.lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"{where}={value!r} is invalid; expected true or false")
        try:
            return annotation(value)
        except (TypeError, ValueError):
            raise ValueError(
                f"{where}={value!r} is invalid; expected a {annotation.__name__}"
            ) from None
    if annotation is int and isinstance(value, bool):
        raise ValueError(f"{where}={value!r} is invalid; expected an int")
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def build_options(options_cls: type, name: str, values: dict[str, Any]) -> Any:
    """``options_cls`` built from a dict: unknown keys, bad types, values outside the declared
    ranges and choices, and the class's own ``validate()`` rules raise ConfigError."""
    hints = typing.get_type_hints(options_cls)
    declared = {
        f.name: (hints[f.name], f.metadata.get("bounds"), f.metadata.get("choices") or ())
        for f in dataclasses.fields(options_cls)
    }
    typed = check_given(name, values, declared)
    try:
        options = options_cls(**typed)
        check_declared(options)  # the defaults too
        getattr(options, "validate", lambda: None)()
    except ValueError as exc:
        raise ConfigError(f"algorithm {name!r}: {exc}") from None
    return options


def check_given(
    algorithm: str, values: dict[str, Any], declared: dict[str, tuple[Any, str | None, Choices]]
) -> dict[str, Any]:
    """The given values coerced to their types, after checking their names, types, ranges and
    choices against their declarations (name -> annotation, bounds, choices); ConfigError.
    `build_options` declares them from the Options class, the command line from the
    catalogue, before the methods are imported."""
    _check_names(algorithm, values, list(declared))
    try:
        return {key: check_value(key, value, *declared[key]) for key, value in values.items()}
    except ValueError as exc:
        raise ConfigError(f"algorithm {algorithm!r}: {exc}") from None


def _check_names(algorithm: str, values: dict[str, Any], fields: list[str]) -> None:
    unknown = sorted(set(values) - set(fields))
    if unknown:
        allowed = ", ".join(sorted(fields)) or "none"
        raise ConfigError(
            f"algorithm {algorithm!r} has no option(s) {', '.join(unknown)}; its options: {allowed}"
        )


def describe_options(options_cls: type) -> list[tuple[str, Any, str]]:
    """(option, default, help) for each field, for --help and the docs."""
    return [
        (f.name, f.default, f.metadata.get("help", "")) for f in dataclasses.fields(options_cls)
    ]
