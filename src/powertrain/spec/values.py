"""The base of every spec model: a boolean is refused wherever a number goes.

YAML 1.1 reads ``true``/``false``, ``yes``/``no`` and ``on``/``off`` as booleans, and pydantic's lax
mode turns ``True`` into ``1`` for an ``int`` or ``float`` field, so ``tp: true`` or ``micro_batch: yes``
would run as 1 without a word. :class:`SpecModel` checks each field before pydantic converts it: a
boolean given to a field whose type takes a number and no boolean (``int``, ``float | None``, the items
of ``list[int]`` or ``tuple[int, int]``) is refused naming the field. Every other value is left to
pydantic and the field's own validators.
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationInfo, field_validator

_NUMBERS = (int, float)
_CONTAINERS = (list, tuple, set, frozenset)
BOOL_FOR_NUMBER = ("is a boolean (YAML reads true/false, yes/no and on/off as booleans), where a number goes; "
                   "write the number")


def _members(annotation: Any) -> list[Any]:
    """The alternatives of a union (``int | None`` → int, None), ``Annotated`` unwrapped."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [m for a in get_args(annotation) for m in _members(a)]
    return [annotation]


def _takes(annotation: Any) -> tuple[bool, bool]:
    """(takes a number, takes a boolean) for a value of type ``annotation``."""
    number = boolean = False
    for m in _members(annotation):
        if m is bool or m is Any or m is object:
            boolean = True
        elif get_origin(m) is Literal:
            boolean = boolean or any(isinstance(v, bool) for v in get_args(m))
        elif isinstance(m, type) and issubclass(m, _NUMBERS):
            number = True
    return number, boolean


def _item_types(annotation: Any) -> list[Any]:
    """The item types of the list / tuple / set alternatives of ``annotation`` (``...`` left out)."""
    return [a for m in _members(annotation) if get_origin(m) in _CONTAINERS for a in get_args(m) if a is not Ellipsis]


def refuse_bool_for_number(annotation: Any, value: Any) -> None:
    """Raise ``ValueError`` when ``value`` is, or holds as an item, a boolean where ``annotation`` takes a
    number and no boolean."""
    if isinstance(value, bool):
        number, boolean = _takes(annotation)
        if number and not boolean:
            raise ValueError(f"{str(value).lower()} {BOOL_FOR_NUMBER}")
    elif isinstance(value, list | tuple) and any(isinstance(v, bool) for v in value):
        takes = [_takes(a) for a in _item_types(annotation)]
        if any(n for n, _ in takes) and not any(b for _, b in takes):
            i = next(i for i, v in enumerate(value) if isinstance(v, bool))
            raise ValueError(f"item {i} ({str(value[i]).lower()}) {BOOL_FOR_NUMBER}")


class SpecModel(BaseModel):
    """A pydantic model read from a spec file: booleans are refused where numbers go (module doc)."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, value: Any, info: ValidationInfo) -> Any:
        # runs for every field of every grid point: only a boolean, or a list or tuple, is looked at further
        if isinstance(value, bool | list | tuple) and info.field_name is not None:
            refuse_bool_for_number(cls.model_fields[info.field_name].annotation, value)
        return value
