"""One reader and one writer for every record of a run file, driven by the records' fields.

A record (:class:`Record`) is a frozen dataclass whose fields say what they hold: the type
(text, true/false, a number, a nested record, a list or an object of them, or a figure type with
its own ``from_dict``, such as an :class:`~medfed.metrics.Interval`) and, through
:mod:`medfed.core.kinds`, what each number may be. :func:`write` turns a record into the JSON
object medfed writes, in field order; :func:`read` checks a JSON object against the fields and
names the file and the field in every error.
"""

from __future__ import annotations

import functools
import math
import types
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from dataclasses import MISSING, Field, dataclass, fields, is_dataclass
from typing import Any, ClassVar, TypeVar, Union, get_args, get_origin, get_type_hints

from medfed.core.errors import RunDirError
from medfed.core.kinds import FIGURE, RAW, WHOLE, Kind
from medfed.core.versions import REDO, VERSION_KEY

R = TypeVar("R", bound="Record")


class Record:
    """A record of a run file: written and read by its fields (see the module).

    It also reads as its JSON does (``summary["sites"]["a"]["auc"]``, ``.items()``), for scripts
    and tests that compare against the file; library code reads attributes. Nothing written
    through that view reaches the object (each read is a copy).
    """

    WHERE: ClassVar[str] = "record"  # how an error names the file when the caller does not

    def to_dict(self) -> dict[str, Any]:
        return write(self)

    @classmethod
    def from_dict(cls: type[R], data: Any, where: str | None = None, path: str = "") -> R:
        return read(cls, data, where or cls.WHERE, path)

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_dict().get(key, default)

    def keys(self) -> KeysView[str]:
        return self.to_dict().keys()

    def items(self) -> ItemsView[str, Any]:
        return self.to_dict().items()

    def values(self) -> ValuesView[Any]:
        return self.to_dict().values()


# ---------------------------------------------------------------------------- the declarations
@dataclass(frozen=True)
class Slot:
    """One field of a record as read and written: its type, unwrapped, and its declaration."""

    name: str
    tp: Any  # the type without None
    optional: bool  # None is a value of it
    meta: Mapping[str, Any]
    default: Any  # what a file without the key reads as; MISSING: required
    factory: bool = False  # ``default`` is called for a fresh value (a list, a dict)

    @property
    def kind(self) -> Kind | None:
        return self.meta.get("kind")


def _strip_none(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) < len(get_args(tp)):
            return (args[0] if len(args) == 1 else Union[tuple(args)]), True  # noqa: UP007
    return tp, False


def _default(f: Field) -> tuple[Any, bool]:
    if f.metadata.get("missing", MISSING) is not MISSING:
        return f.metadata["missing"], False
    if f.default_factory is not MISSING:
        return f.default_factory, True
    return f.default, False


@functools.cache
def slots(cls: type) -> tuple[Slot, ...]:
    """The fields of record class ``cls`` in the order they are written."""
    hints = get_type_hints(cls)
    out = []
    for f in fields(cls):
        tp, optional = _strip_none(hints[f.name])
        out.append(Slot(f.name, tp, optional, f.metadata, *_default(f)))
    return tuple(out)


def is_record(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, Record)


@functools.cache
def keys_of(cls: type) -> frozenset[str]:
    """Every key a record of ``cls`` writes itself (flattened records' keys included)."""
    out: set[str] = set()
    for slot in slots(cls):
        if slot.meta.get("flatten"):
            out |= {slot.meta.get("prefix", "") + key for key in keys_of(slot.tp)}
        elif not slot.meta.get("rest"):
            out.add(slot.name)
    return frozenset(out)


# ---------------------------------------------------------------------------- writing
def write(record: Any) -> dict[str, Any]:
    """The JSON object of ``record``: its fields in order, flattened records inline."""
    data: dict[str, Any] = {}
    for slot in slots(type(record)):
        value = getattr(record, slot.name)
        if slot.meta.get("rest"):
            data |= value
        elif slot.meta.get("flatten"):
            if value is not None:
                inner = write(value)
                data |= {slot.meta.get("prefix", "") + k: v for k, v in inner.items()}
        elif not (value is None and slot.meta.get("omit_none")):
            data[slot.name] = _plain(value)
    for key, anchor in (m for s in slots(type(record)) for m in s.meta.get("after", {}).items()):
        data = _move_after(data, key, anchor)
    return data


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if is_dataclass(value):
        return value.to_dict()  # type: ignore[attr-defined]
    return value


def _move_after(data: dict[str, Any], key: str, anchor: str) -> dict[str, Any]:
    if key not in data or anchor not in data:
        return data
    value = data.pop(key)
    out: dict[str, Any] = {}
    for k, v in data.items():
        out[k] = v
        if k == anchor:
            out[key] = value
    return out


# ---------------------------------------------------------------------------- reading
def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def bad(where: str, path: str, expected: str, value: Any) -> RunDirError:
    """The error for field ``path`` of file ``where`` holding ``value`` instead of ``expected``."""
    return RunDirError(f"{where}: field {path!r} should be {expected}, got {_shown(value)}; {REDO}")


def _object(data: Any, where: str, path: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        what = f"field {path.rstrip('.')!r}" if path else "the record"
        got = "null" if data is None else type(data).__name__
        raise RunDirError(f"{where}: {what} should be a JSON object, got {got}; {REDO}")
    return data


def read(cls: type[R], data: Any, where: str, path: str = "") -> R:
    """A ``cls`` record from the JSON object ``data``, each value checked against its field."""
    return cls(**read_fields(cls, _object(data, where, path), where, path))


def read_fields(cls: type, data: Mapping[str, Any], where: str, path: str) -> dict[str, Any]:
    """The constructor arguments of a ``cls`` record, read from ``data`` field by field."""
    values: dict[str, Any] = {}
    for slot in slots(cls):
        if slot.meta.get("rest"):
            values[slot.name] = _rest(cls, slot, data, where, path)
        elif slot.meta.get("flatten"):
            values[slot.name] = _flat(slot, data, where, path)
        elif slot.name in data:
            values[slot.name] = _value(slot, data[slot.name], where, path + slot.name, top=True)
        elif slot.default is MISSING:
            raise RunDirError(f"{where}: missing required field {path + slot.name!r}; {REDO}")
        else:
            values[slot.name] = slot.default() if slot.factory else slot.default
    return values


def _flat(slot: Slot, data: Mapping[str, Any], where: str, path: str) -> Any:
    prefix = slot.meta.get("prefix", "")
    keys = keys_of(slot.tp)
    if slot.optional and not any(prefix + key in data for key in keys):
        return None
    inner = {key[len(prefix) :]: value for key, value in data.items() if key.startswith(prefix)}
    return slot.tp(**read_fields(slot.tp, inner, where, path + prefix))


def _rest(cls: type, slot: Slot, data: Mapping[str, Any], where: str, path: str) -> Any:
    own = keys_of(cls)
    out = {}
    for key, value in data.items():
        if key in own or key == VERSION_KEY:
            continue
        if not (slot.kind or RAW).accepts(value):
            raise bad(where, path + key, slot.meta.get("expected") or "a number", value)
        out[key] = float(value)
    return out


def _value(slot: Slot, value: Any, where: str, path: str, *, top: bool = False) -> Any:
    """``value`` read as ``slot`` says (``top``: the field itself, not an item inside it)."""
    if value is None and slot.optional:
        return None
    tp, origin = slot.tp, get_origin(slot.tp)
    if origin is list:
        return _list(slot, value, where, path)
    if origin is dict:
        return _dict(slot, value, where, path, top=top)
    if is_record(tp):
        return read(tp, value, where, path + ".")
    if is_dataclass(tp):
        return _figures(tp, value, where, path)
    return _scalar(slot, value, where, path)


def _scalar(slot: Slot, value: Any, where: str, path: str) -> Any:
    null = slot.optional
    if slot.tp is str:
        if isinstance(value, str):
            return value
        raise bad(where, path, "text or null" if null else "text", value)
    if slot.tp is bool:
        if isinstance(value, bool):
            return value
        raise bad(where, path, "true, false or null" if null else "true or false", value)
    if slot.tp in (int, float):
        kind = _number_kind(slot)
        if kind.accepts(value):
            return slot.tp(value)
        raise bad(where, path, f"{kind.expected}, or null" if null else kind.expected, value)
    return value  # Any: as written


def _number_kind(slot: Slot) -> Kind:
    return slot.kind or (WHOLE if slot.tp is int else FIGURE)


def _item(slot: Slot, tp: Any) -> Slot:
    inner, optional = _strip_none(tp)
    return Slot(slot.name, inner, optional, slot.meta, MISSING)


def _list(slot: Slot, value: Any, where: str, path: str) -> list[Any]:
    (item_tp,) = get_args(slot.tp)
    if not isinstance(value, list):
        raise bad(where, path, "a list of numbers or null" if slot.optional else "a list", value)
    item = _item(slot, item_tp)
    expected = slot.meta.get("expected")
    out = []
    for k, entry in enumerate(value):
        try:
            out.append(_value(item, entry, where, f"{path}.{k}"))
        except RunDirError:
            if expected is not None:  # the list is named as a whole
                raise bad(where, path, expected, value) from None
            if item.tp not in (int, float) or entry is None:
                raise
            # A bad number in a list that may hold nulls is still named by its kind alone.
            raise bad(where, f"{path}.{k}", _number_kind(item).expected, entry) from None
    return out


def _dict(slot: Slot, value: Any, where: str, path: str, *, top: bool) -> dict[str, Any]:
    _, item_tp = get_args(slot.tp)
    if not isinstance(value, Mapping):
        if not top:
            _object(value, where, path + ".")
        raise bad(where, path, slot.meta.get("expected") or "a JSON object", value)
    item = _item(slot, item_tp)
    figures = is_dataclass(item.tp) and not is_record(item.tp)
    out = {}
    for key, entry in value.items():
        if figures and entry is None:
            continue  # a figure that could not be computed
        out[key] = _value(item, entry, where, f"{path}.{key}")
    return out


def _finite_tree(value: Any) -> str | None:
    """The path (``.a.b``) to the first NaN or infinity inside a JSON value, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    if isinstance(value, Mapping):
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        inner = _finite_tree(item)
        if inner is not None:
            return f".{key}{inner}"
    return None


def _at(value: Any, path: str) -> Any:
    """The item of ``value`` at ``path`` as :func:`_finite_tree` gives it (``.a.0``)."""
    for part in path.split(".")[1:]:
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def _figures(cls: Any, value: Any, where: str, path: str) -> Any:
    """A figure type with its own ``from_dict`` (an Interval, an OperatingPoint, ...)."""
    inner = _finite_tree(value)
    if inner is not None:
        raise bad(where, path + inner, "a finite number", _at(value, inner))
    try:
        return cls.from_dict(value)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise bad(where, path, f"{cls.__name__} figures ({exc})", value) from None
