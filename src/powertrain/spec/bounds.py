"""Reading spec files within bounds, and the characters a spec value may hold.

A spec is read by :func:`load_spec_yaml` only: at most :data:`MAX_SPEC_BYTES` bytes, UTF-8, parsed
with a safe loader that counts what YAML aliases would expand to **before** anything is built (an
"anchor bomb" of a few hundred bytes can stand for billions of nodes; PyYAML shares them, but every
later copy, validation or dump expands them) and refuses a mapping that writes one key twice
(:mod:`powertrain.core.yamlfile`: PyYAML would keep the second without a word). Every refusal is one
line naming the file and the number over its limit, or the line of the repeated key; anything but a
regular file (a FIFO, ``/dev/zero``, a socket) is refused before it is opened.

:func:`control_char_field` finds newlines, carriage returns and NULs in keys and values: none of
them has a meaning in a configuration value, and in a value that reaches a generated shell or batch
script a newline starts a new command.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml

from powertrain.core.files import NotRegularFile, file_kind, read_regular_bytes
from powertrain.core.yamlfile import UniqueKeyLoader

MAX_SPEC_BYTES = 1 << 20  # 1 MiB: the study's largest spec is a few KiB
MAX_ALIAS_NODES = 10_000  # nodes that alias expansion may add to what the file spells out
MAX_ALIASES = 1_000  # alias uses in one file
DEFAULT_MAX_POINTS = 100_000  # grid points of one sweep, counted before expansion
CONTROL_CHARS = {"\n": "a newline", "\r": "a carriage return", "\x00": "a NUL"}


class SpecFileError(ValueError):
    """A spec file that is refused before its content is read as a configuration (one line)."""


def shown(value: object) -> str:
    """``value`` as text on one line: control characters written as escapes."""
    text = str(value)
    return repr(text)[1:-1] if any(c in text for c in CONTROL_CHARS) or not text.isprintable() else text


def control_char(text: str) -> str | None:
    """The name of the first control character ``text`` holds (newline, carriage return, NUL), else None."""
    for ch, name in CONTROL_CHARS.items():
        if ch in text:
            return name
    return None


def control_char_field(raw: Any, where: str = "", skip: frozenset[str] = frozenset()) -> tuple[str, str] | None:
    """(dotted field, character name) of the first key or string value holding a control character.

    ``skip`` names top-level keys whose values are free text (a description) and may span lines.
    """
    if isinstance(raw, str):
        name = control_char(raw)
        return (where or "value", name) if name else None
    if isinstance(raw, dict):
        for key, value in raw.items():
            field = f"{where}.{key}" if where else str(key)
            name = control_char(str(key))
            if name:
                return shown(field), name
            if not where and key in skip:
                value = value.replace("\n", " ").replace("\r", " ") if isinstance(value, str) else value
            found = control_char_field(value, field)
            if found:
                return found
    elif isinstance(raw, list | tuple):
        for i, value in enumerate(raw):
            found = control_char_field(value, f"{where}[{i}]")
            if found:
                return found
    return None


def read_spec_bytes(path: Path, limit: int = MAX_SPEC_BYTES) -> bytes:
    """The bytes of a spec file, refused (one line) when missing, a directory, not a regular file (a FIFO
    would hang the read, ``/dev/zero`` never end), unreadable or over ``limit``.

    At most ``limit + 1`` bytes are read, so a file that grows while it is read is refused too.
    """
    try:
        st = path.stat()
    except FileNotFoundError:
        raise SpecFileError(f"spec file {shown(path)} does not exist") from None
    except OSError as exc:
        raise SpecFileError(f"{shown(path)}: cannot read the spec file: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise SpecFileError(f"{shown(path)} is a directory, not a spec file; give the YAML file inside it")
    if not stat.S_ISREG(st.st_mode):  # looked at before opening: opening a FIFO waits for a writer
        raise SpecFileError(f"{shown(path)}: is {file_kind(st.st_mode)}, not a regular file; give the spec as a "
                            "regular file")
    if st.st_size > limit:
        raise SpecFileError(f"{shown(path)}: spec file is {st.st_size:,} bytes, over the limit of {limit:,} bytes "
                            f"({limit / 2**20:g} MiB)")
    try:
        data = read_regular_bytes(path, "the spec", limit)  # refuses a FIFO swapped in since the stat, too
    except NotRegularFile as exc:
        raise SpecFileError(shown(str(exc))) from None
    except OSError as exc:
        raise SpecFileError(f"{shown(path)}: cannot read the spec file: {exc.strerror}") from None
    if len(data) > limit:
        raise SpecFileError(f"{shown(path)}: spec file is more than {limit:,} bytes ({limit / 2**20:g} MiB), "
                            "the limit")
    return data


def read_spec_text(path: Path, limit: int = MAX_SPEC_BYTES) -> str:
    """:func:`read_spec_bytes` decoded as UTF-8; other encodings are refused with the first bad byte."""
    data = read_spec_bytes(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecFileError(f"{shown(path)}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                            "save the spec as UTF-8") from None


def yaml_error_line(exc: yaml.YAMLError) -> str:
    """A YAML parser error on one line: where and what."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = " ".join(str(x) for x in (exc.context, exc.problem) if x)
        return shown(f"{where}{what}".strip())
    return " ".join(str(exc).split())


class _Budget(Exception):
    """Raised inside the loader when the alias budget is spent."""


class BoundedLoader(UniqueKeyLoader):
    """The safe loader that refuses repeated keys, counting alias uses while composing (refused beyond
    :data:`MAX_ALIASES`)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.alias_uses = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            self.alias_uses += 1
            if self.alias_uses > MAX_ALIASES:
                raise _Budget(f"more than {MAX_ALIASES:,} YAML aliases (*name), the limit")
        return super().compose_node(parent, index)


def expanded_nodes(root: yaml.Node) -> tuple[int, int]:
    """(nodes the document spells out, nodes it stands for once every alias is expanded).

    Computed on the composed graph, where an alias is the anchored node itself: nothing is copied.
    A recursive alias (a node that contains itself) is refused.
    """
    weight: dict[int, int] = {}
    active: set[int] = set()

    def visit(node: yaml.Node) -> int:
        key = id(node)
        if key in weight:
            return weight[key]
        if key in active:
            raise _Budget("a YAML alias refers to a node that contains it (recursive anchor)")
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(visit(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(visit(k) + visit(v) for k, v in node.value)
        active.discard(key)
        weight[key] = total
        return total

    expanded = visit(root)
    return len(weight), expanded


def load_spec_yaml(path: Path, limit: int = MAX_SPEC_BYTES) -> Any:
    """A spec file's YAML (safe tags only, each key of a mapping once), read within the size, encoding and
    alias bounds above.

    Every refusal is a :class:`SpecFileError` with one line naming the file (and the line, for YAML).
    """
    text = read_spec_text(path, limit)
    try:
        loader = BoundedLoader(text)  # the reader refuses unprintable characters (a NUL) here already
    except yaml.YAMLError as exc:
        raise SpecFileError(f"{shown(path)} is not valid YAML: {yaml_error_line(exc)}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        written, expanded = expanded_nodes(node)
        if expanded - written > MAX_ALIAS_NODES:
            raise SpecFileError(
                f"{shown(path)}: YAML aliases expand {written:,} written nodes to {expanded:,} nodes, more than "
                f"the {MAX_ALIAS_NODES:,} that aliases may add; write the values out or use fewer nested anchors")
        return loader.construct_document(node)
    except _Budget as exc:
        raise SpecFileError(f"{shown(path)}: {exc}") from None
    except yaml.YAMLError as exc:
        raise SpecFileError(f"{shown(path)} is not valid YAML: {yaml_error_line(exc)}") from None
    except RecursionError:
        raise SpecFileError(f"{shown(path)}: YAML nested too deeply") from None
    finally:
        loader.dispose()
