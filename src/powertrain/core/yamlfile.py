"""Reading YAML: safe tags only, and every key of a mapping written once.

PyYAML keeps the last of two equal keys without a word (``{tp: 1, pp: 1, tp: 2}`` reads as ``tp: 2``,
two ``model:`` keys as the second), so a copy-paste slip would become a silently different spec,
catalog entry or profile. Every YAML file powertrain reads goes through :func:`load_yaml` — spec files
through ``spec.bounds``, whose loader derives from :class:`UniqueKeyLoader` — and a repeated key is
refused as a :class:`DuplicateKeyError` naming the key, its file, and both lines.

A YAML *file* is read through :func:`load_yaml_file`, which refuses anything but a regular file first
(:mod:`powertrain.core.files`): a FIFO in its place would hang the reader.

Keys are compared as constructed values (``1`` and ``0x1`` are one key), and only the keys a mapping
writes itself: a key that overrides one brought in by a ``<<: *anchor`` merge is what merging is for.
"""

from __future__ import annotations

import io
import os
from typing import Any

import yaml

from powertrain.core.files import read_regular_text

MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.constructor.ConstructorError, ValueError):
    """A mapping that writes one key twice. A ``MarkedYAMLError`` (its mark is the second key's file,
    line and column) and a ``ValueError`` (callers that refuse bad content catch those); ``str()`` is
    one line."""

    def __str__(self) -> str:
        mark = self.problem_mark
        where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        return f"{where}{self.problem}"


def _check_keys(loader: yaml.constructor.SafeConstructor, node: yaml.MappingNode, checked: set[int]) -> None:
    """Refuse a key ``node`` writes twice. Called before the node's ``<<`` merges are flattened into it
    (flattening rewrites ``node.value``), once per node: an anchored mapping is flattened again wherever
    it is merged, and by then holds the merged keys too."""
    if id(node) in checked:
        return
    checked.add(id(node))
    first: dict[Any, yaml.Mark] = {}
    for key_node, _ in node.value:
        if key_node.tag == MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
            continue  # a non-scalar key is refused (unhashable) or kept by PyYAML itself
        key = loader.construct_object(key_node)
        if key in first:
            shown = repr(key) if isinstance(key, str) else str(key)
            raise DuplicateKeyError(
                None, None, f"duplicate key {shown} (first on line {first[key].line + 1}); a mapping holds each "
                            "key once — keep the one you mean and delete the other", key_node.start_mark)
        first[key] = key_node.start_mark


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping writing one key twice (:class:`DuplicateKeyError`)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.checked_mappings: set[int] = set()

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        _check_keys(self, node, self.checked_mappings)
        super().flatten_mapping(node)


if hasattr(yaml, "CSafeLoader"):
    class FastUniqueKeyLoader(yaml.CSafeLoader):
        """:class:`UniqueKeyLoader` on libyaml's parser: the packaged published-run tables hold hundreds of
        runs, which the pure-Python parser takes seconds to read."""

        def __init__(self, stream: Any) -> None:
            super().__init__(stream)
            self.checked_mappings: set[int] = set()

        def flatten_mapping(self, node: yaml.MappingNode) -> None:
            _check_keys(self, node, self.checked_mappings)
            super().flatten_mapping(node)

    _LOADER: type[Any] = FastUniqueKeyLoader
else:  # PyYAML built without libyaml
    _LOADER = UniqueKeyLoader


def load_yaml(text: str, name: str | os.PathLike[str] = "<string>") -> Any:
    """The YAML document ``text`` (safe tags only), refusing a repeated mapping key.

    ``name`` (the file it came from) is what every error's mark names, so a refusal reads
    ``FILE, line N, column M: …``."""
    stream = io.StringIO(text)
    stream.name = str(name)  # PyYAML names a stream's marks (every error's FILE, line N) after this
    loader = _LOADER(stream)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_yaml_file(path: str | os.PathLike[str], what: str = "the YAML file") -> Any:
    """:func:`load_yaml` of the file at ``path``, UTF-8. A FIFO, device, socket or directory there is a
    :class:`~powertrain.core.files.NotRegularFile` (one line naming it) before anything is opened for
    reading, instead of a read that waits for ever."""
    return load_yaml(read_regular_text(path, what), path)
