"""One strict, typed layer for the sections of params.yaml (pydantic v2).

Each stage's library module declares its section as a :class:`Section` subclass whose field
defaults equal params.yaml (tests/unit/core/test_config.py checks it, so deleting a line never changes a
run). Unknown keys are rejected with the list of valid ones; a value of the wrong type is
rejected with ``section.key``, the value and the fix, never a TypeError from deep inside:

    params.yaml: clean.min_chars = 'x': must be an integer; fix it in params.yaml

Types are strict where YAML is unambiguous (``"false"`` is not a boolean, ``"16k"`` and ``3.5``
are not integers, ``true`` is not a number). Numbers may be given as strings that Python reads
as numbers because YAML 1.1 reads ``5e-4`` (no dot) as a string.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Strict, ValidationError

from pipeline.core.errors import BertraceError


def _number(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("must be a number, not true/false")
    if isinstance(value, str):
        try:
            return float(value)  # YAML 1.1: 5e-4 without a dot is a string
        except ValueError:
            raise ValueError("must be a number") from None
    return value


def _integer(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("must be an integer, not true/false")
    if isinstance(value, float) and value.is_integer():
        return int(value)  # 1e4 is read as 10000.0
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise ValueError("must be an integer") from None
        if not number.is_integer():
            raise ValueError("must be an integer")
        return int(number)
    return value


Float = Annotated[float, BeforeValidator(_number)]
Int = Annotated[int, BeforeValidator(_integer), Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]

_MESSAGES = {  # pydantic error type -> what to say
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
    "int_parsing": "must be an integer",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "bool_type": "must be true or false (no quotes)",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "tuple_type": "must be a list",
    "literal_error": None,  # pydantic's own text lists the choices
    "too_short": None,
    "too_long": None,
}


# Ranges are declared one way, ``Annotated[Int, Field(ge=1, description=hint)]``, and read
# ``must be >= 1 (hint)``: the bound from pydantic's error context, the hint from the field.
_RANGES = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}


def _describe(err: dict, hint: str | None = None) -> str:
    kind = err.get("type", "")
    if kind in _RANGES:
        name, op = _RANGES[kind]
        return f"must be {op} {err.get('ctx', {}).get(name)}" + (f" ({hint})" if hint else "")
    msg = _MESSAGES.get(kind)
    if kind in ("too_short", "too_long") and hint:
        return f"{err.get('msg', 'wrong length')[0].lower()}{err.get('msg', '')[1:]} ({hint})"
    if msg is None:
        msg = err.get("msg", "invalid")
        for prefix in ("Value error, ", "Assertion failed, "):
            if msg.startswith(prefix):
                msg = msg[len(prefix) :]
        msg = msg[0].lower() + msg[1:] if msg else "invalid"
    return msg


def format_errors(e: ValidationError, model: type[BaseModel], section: str, source: str) -> str:
    """One line per problem: ``source: section.key = value: what is wrong; the fix``."""
    lines = []
    for err in e.errors(include_url=False):
        loc = [str(p) for p in err.get("loc", ()) if not (isinstance(p, str) and p.startswith("function-"))]
        key = ".".join([section, *loc]) if loc else section
        kind = err.get("type", "")
        if kind == "extra_forbidden":
            parent = _submodel(model, loc[:-1])
            valid = ", ".join(sorted(parent.model_fields)) if parent is not None else "see params.yaml"
            lines.append(f"{source}: {key}: unknown key; valid keys: {valid} (a typo? fix it in {source})")
        elif kind == "missing":
            lines.append(f"{source}: {key} is missing; restore it from the repository's params.yaml")
        elif not loc:
            lines.append(f"{source}: {section}: {_describe(err)}; fix it in {source}")
        else:
            hint = _field_hint(model, loc)
            lines.append(f"{source}: {key} = {err.get('input')!r}: {_describe(err, hint)}; fix it in {source}")
    return "\n".join(lines)


def _field_hint(model: type[BaseModel], loc: list[str]) -> str | None:
    """The ``description`` of the field at ``loc`` (list indices skipped), if it has one."""
    names = [p for p in loc if not p.isdigit()]
    parent = _submodel(model, names[:-1]) if names else None
    field = parent.model_fields.get(names[-1]) if parent is not None else None
    return getattr(field, "description", None)


def _submodel(model: type[BaseModel], loc: list[str]) -> type[BaseModel] | None:
    for part in loc:
        field = model.model_fields.get(part)
        ann = getattr(field, "annotation", None) if field is not None else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return None
        model = ann
    return model


class Section(BaseModel):
    """A params.yaml section (or a nested mapping of one): unknown keys and wrong types are errors."""

    model_config = ConfigDict(extra="forbid", validate_default=True, validate_assignment=True)
    SECTION: ClassVar[str] = ""

    @classmethod
    def from_params(cls, params: dict | None, *, source: str = "params.yaml", section: str | None = None):
        """Validate ``params`` (the section's mapping); raise BertraceError naming ``section.key``."""
        section = section or cls.SECTION
        if params is not None and not isinstance(params, dict):
            raise BertraceError(
                f"{source}: {section} must be a mapping of keys, got {params!r}; "
                f"restore it from the repository's params.yaml"
            )
        try:
            return cls.model_validate(params or {})
        except ValidationError as e:
            raise BertraceError(format_errors(e, cls, section, source)) from None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able values (tuples as lists), e.g. for provenance records and checkpoints."""
        return self.model_dump(mode="json")
