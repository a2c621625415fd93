"""Command-line flags declared once, as dataclass fields (`flag(...)`), and everything derived
from them: the argparse options, the conversion of parsed or JSON values, and the checks.

A flag field of a dataclass with prefix P (a policy name, or "" for the plugin's common flags)
is the option `--P-field-name` with destination `P_field_name`. Its metadata holds the help
text, metavar, allowed choices (as text), minimum, an optional parse function (text or JSON
value -> field value, for fields whose value is not what the command line gives, such as a
tuple or an enum) and an optional custom check. Imports nothing of the project, so every
module can declare flags without an import cycle.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

_METADATA_KEY = "sgl_adaspec_flag"
_BASIC_TYPES = {"int": int, "float": float, "str": str, "bool": bool}
_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


class ConfigError(ValueError):
    """A plugin flag or flag combination that cannot work; the message names the problem."""


class ConfigTypeError(ConfigError, TypeError):
    """A flag value of the wrong type."""


def comma_floats(text: str) -> tuple[float, ...]:
    """An argparse `type` for a comma-separated list of numbers ("1,2,4.5")."""
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")


@dataclass(frozen=True)
class FlagSpec:
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    # Replaces the requirement in messages ("--x must be <must>, got ..."); default: from the
    # choices, the minimum or the type.
    must: str | None = None
    # Text (command line) or JSON value -> field value; may raise ValueError or TypeError.
    parse: Callable[[Any], Any] | None = None
    # (value, label) -> None; raises ValueError naming `label` (runs after the generic checks).
    check: Callable[[Any, str], None] | None = None
    argparse: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def flag(
    default: Any,
    help: str,
    *,
    metavar: str | None = None,
    choices: tuple[str, ...] | None = None,
    minimum: float | None = None,
    must: str | None = None,
    parse: Callable[[Any], Any] | None = None,
    check: Callable[[Any, str], None] | None = None,
    **argparse_kwargs: Any,
) -> Any:
    """A dataclass field that is a command-line flag (see the module docstring). `help` may use
    argparse's %(default)s; extra keyword arguments go to `add_argument` (nargs, const, action)."""
    spec = FlagSpec(help, metavar, choices, minimum, must, parse, check, argparse_kwargs)
    return dataclasses.field(default=default, metadata={_METADATA_KEY: spec})


def flag_fields(cls_or_obj: Any) -> Iterator[dataclasses.Field]:
    """The flag fields of a dataclass (class or instance), in declaration order."""
    return (f for f in dataclasses.fields(cls_or_obj) if _METADATA_KEY in f.metadata)


def option(prefix: str, name: str) -> str:
    """The command-line option of field `name`: --prefix-name (--name for prefix "")."""
    return "--" + dest(prefix, name).replace("_", "-")


def dest(prefix: str, name: str) -> str:
    """The argparse destination and JSON key of field `name`: prefix_name."""
    return f"{prefix}_{name}" if prefix else name


def add_flags(group: argparse._ActionsContainer, cls: type, prefix: str = "") -> None:
    """One `add_argument` per flag field of `cls`."""
    for f in flag_fields(cls):
        spec = _spec(f)
        default = f.default.value if isinstance(f.default, enum.Enum) else f.default
        kwargs: dict[str, Any] = {"default": default, "help": spec.help, **spec.argparse}
        if kwargs.get("action") not in ("store_true", "store_false"):
            kwargs.setdefault("metavar", spec.metavar or _choices_metavar(spec))
            # The text, where a parse function makes the value.
            kwargs.setdefault("type", str if spec.parse else _value_type(f)[0] or str)
        group.add_argument(option(prefix, f.name), dest=dest(prefix, f.name), **kwargs)


def flag_values(values: Mapping[str, Any], cls: type, prefix: str = "") -> dict[str, Any]:
    """Field name -> checked value of the flags of `cls` present in `values` (an argparse
    namespace's vars or decoded JSON, keyed by destination). Raises ConfigError naming the
    option."""
    out = {}
    for f in flag_fields(cls):
        key = dest(prefix, f.name)
        if key in values:
            out[f.name] = load_value(f, values[key], option(prefix, f.name))
    return out


def load_value(f: dataclasses.Field, raw: Any, label: str) -> Any:
    """The value of flag field `f` given as text (command line) or JSON, checked."""
    spec = _spec(f)
    value = raw
    if raw is not None:
        if spec.choices is not None and _plain(raw) not in spec.choices:
            raise ConfigError(f"{label} must be {_requirement(f)}, got {raw!r}")
        if spec.parse is not None:  # parse functions also take the field's own values
            try:
                value = spec.parse(raw)
            except (ValueError, TypeError) as exc:
                if isinstance(exc, ConfigError):
                    raise
                raise ConfigError(f"{label} must be {_requirement(f)}, got {raw!r}") from None
    check_value(f, value, label)
    return value


def check_flags(obj: Any, prefix: str = "") -> None:
    """Check every flag field of dataclass instance `obj`. Messages name the option
    (`--name`) for prefix "", and `prefix name` otherwise (a policy config built in code)."""
    for f in flag_fields(obj):
        label = f"{prefix} {f.name}" if prefix else option("", f.name)
        check_value(f, getattr(obj, f.name), label)


def check_value(f: dataclasses.Field, value: Any, label: str) -> None:
    """The checks of flag field `f` on `value`: type, choices, minimum, then the field's own."""
    spec = _spec(f)
    kind, optional = _value_type(f)
    if value is None:
        if not optional:
            raise ConfigTypeError(f"{label} must be {_requirement(f)}, got None")
        return
    if kind is not None:
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        if kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    else:
        ok = f.default is None or isinstance(value, type(f.default))
    if not ok:
        wanted = spec.must or _TYPE_NAMES.get(kind) or f"a {type(f.default).__name__}"
        raise ConfigTypeError(f"{label} must be {wanted}, got {value!r}")
    if spec.choices is not None and _plain(value) not in spec.choices:
        raise ConfigError(f"{label} must be {_requirement(f)}, got {_plain(value)!r}")
    if spec.minimum is not None and value < spec.minimum:
        raise ConfigError(f"{label} must be {_requirement(f)}, got {value!r}")
    if spec.check is not None:
        try:
            spec.check(value, label)
        except ConfigError:
            raise
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def dump_flags(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Destination -> JSON value of every flag field of dataclass instance `obj` (enums as
    their value, tuples as lists); `flag_values` reads them back."""
    return {dest(prefix, f.name): _plain(getattr(obj, f.name)) for f in flag_fields(obj)}


def _spec(f: dataclasses.Field) -> FlagSpec:
    return f.metadata[_METADATA_KEY]


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return list(value)
    return value


def _value_type(f: dataclasses.Field) -> tuple[type | None, bool]:
    """The field's value type from its annotation, int, float, str or bool (None: another type,
    checked against the default's type), and whether None is allowed ("int | None": int, True)."""
    annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    parts = [part.strip() for part in annotation.split("|")]
    kinds = [part for part in parts if part != "None"]
    kind = _BASIC_TYPES.get(kinds[0]) if len(kinds) == 1 else None
    return kind, len(kinds) < len(parts)


def _requirement(f: dataclasses.Field) -> str:
    spec = _spec(f)
    if spec.must is not None:
        return spec.must
    if spec.choices is not None:
        if len(spec.choices) == 2:
            return " or ".join(spec.choices)
        return "one of " + ", ".join(spec.choices)
    if spec.minimum is not None:
        return f">= {spec.minimum}"
    return _TYPE_NAMES.get(_value_type(f)[0]) or "valid"


def _choices_metavar(spec: FlagSpec) -> str | None:
    return None if spec.choices is None else "{" + ",".join(spec.choices) + "}"
