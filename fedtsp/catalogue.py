"""What the command line offers, readable without importing the methods (and with them torch).

`fedtsp --help`, a bad flag and the first checks of a command's values read
`catalogue.json`: the datasets, the model families, and each algorithm's settings and
options (name, default, help, type, range, choices). `python -m fedtsp.catalogue` writes it
from the registries; a test fails when the file and the registries disagree, so a method's
new option cannot be missing from the command line.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import typing
from pathlib import Path
from typing import Any

PATH = Path(__file__).with_name("catalogue.json")
TYPES: dict[str, type] = {"bool": bool, "int": int, "float": float, "str": str}


def build() -> dict[str, Any]:
    """The catalogue from the registries (imports every method: seconds, not milliseconds)."""
    from fedtsp.algorithms import algorithm_names, get_algorithm
    from fedtsp.data import dataset_names
    from fedtsp.models.families import ARCHITECTURES, FAMILIES, accepted_family_names

    algorithms = {}
    for name in algorithm_names():
        method = get_algorithm(name)
        hints = typing.get_type_hints(method.Options)
        algorithms[name] = {
            "settings": list(method.settings),
            "options": [_option(f, hints[f.name]) for f in dataclasses.fields(method.Options)],
        }
    return {
        "datasets": dataset_names(),
        "families": {name: list(archs) for name, archs in FAMILIES.items()},
        "architectures": list(ARCHITECTURES),
        "family_names": accepted_family_names(),
        "algorithms": algorithms,
    }


def _option(field: dataclasses.Field, annotation: Any) -> dict[str, Any]:
    args = typing.get_args(annotation)
    optional = type(None) in args
    base = next(a for a in args if a is not type(None)) if optional else annotation
    names = {t: n for n, t in TYPES.items()}
    if base not in names:
        raise TypeError(f"option {field.name}: type {annotation!r} has no command-line form")
    choices = field.metadata.get("choices") or ()
    return {
        "name": field.name,
        "default": field.default,
        "help": field.metadata.get("help", ""),
        "type": names[base],
        "optional": optional,
        "bounds": field.metadata.get("bounds"),
        "choices": list(choices() if callable(choices) else choices),
    }


@functools.cache
def load() -> dict[str, Any]:
    """The committed catalogue (milliseconds)."""
    return json.loads(PATH.read_text())


def algorithm_names() -> list[str]:
    return list(load()["algorithms"])


def options(algorithm: str) -> list[dict[str, Any]]:
    """The options of `algorithm` as the catalogue lists them ([] for an unknown name)."""
    return load()["algorithms"].get(algorithm, {}).get("options", [])


def annotation(option: dict[str, Any]) -> Any:
    """An option's Python type as `fedtsp.core.options.check_value` takes it."""
    base = TYPES[option["type"]]
    return base | None if option["optional"] else base


def text(catalogue: dict[str, Any] | None = None) -> str:
    """The catalogue as `catalogue.json` holds it (default: built from the registries)."""
    return json.dumps(build() if catalogue is None else catalogue, indent=1) + "\n"


def main() -> int:
    built = build()
    PATH.write_text(text(built))
    print(f"wrote {PATH.name}: {len(built['algorithms'])} algorithms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
