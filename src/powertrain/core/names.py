"""Names are labels, not paths or commands.

Two rules, one place (issue 29):

* :func:`check_name` — a name that becomes a file or folder name (a run directory, a host's
  ``telemetry/<host>.parquet``, a profile, a label a folder is named after) is **one path component**:
  not empty, not ``.`` or ``..``, no ``/`` or ``\\``, no leading ``-`` (``rm *`` in its folder would read
  it as an option) or ``.`` (a hidden file, where powertrain keeps its own state: ``.specs/``,
  ``.baseline/``), no white space at either end, only printable characters (no control characters, no
  bidi or zero-width format characters, no line separators), and at most :data:`MAX_NAME_BYTES` bytes of
  UTF-8 — fewer than the 255 a file system allows, so the suffixes powertrain adds
  (``.meta.json``, ``.parts``, a temporary file's ``.NAME.XXXXXXXX.tmp``) still fit. A refusal is a
  :class:`BadName` whose one line names the field and says what a name may hold.
* :func:`printable` — text read from data (run names, hosts, devices, reasons) is shown on a terminal with
  every unprintable character written as an escape (``\\x1b``, ``\\u202e``): a terminal escape sequence
  in a run name would clear the screen or retitle the window, a right-to-left override would show
  ``gpj.exe`` as ``exe.jpg``.

"Printable" is Python's :meth:`str.isprintable`: letters, digits, marks, punctuation and symbols of any
script, and the ASCII space; not categories Cc (controls, C0 and C1), Cf (format: U+200E/F, U+202A–202E,
U+2066–2069, zero-width characters), Zl/Zp (line and paragraph separators), Zs other than the space,
Co (private use), Cs (surrogates: undecodable bytes of a file name) or Cn (unassigned).
"""

from __future__ import annotations

MAX_NAME_BYTES = 200
ALLOWED = ("one path component of printable characters (letters, digits, - _ . + and other symbols), "
           f"not starting with - or ., without / or \\, at most {MAX_NAME_BYTES} bytes")


class BadName(ValueError):
    """A name that cannot be a file or folder name; ``str()`` is one line naming the field."""


def printable(text: object) -> str:
    """``text`` with every unprintable character escaped (``\\n``, ``\\x1b``, ``\\u202e``), so what a data
    file holds cannot move the cursor, retitle the terminal or reverse the line it is shown on."""
    s = str(text)
    if s.isprintable():  # the common case: nothing to escape
        return s
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


def label_problem(text: str) -> str | None:
    """Why ``text`` cannot be a label (a character that is not printable), else None."""
    bad = next((c for c in text if not c.isprintable()), None)
    if bad is None:
        return None
    return f"holds the unprintable character {repr(bad)[1:-1]} (a control or format character)"


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be one file or folder name (see the module doc), else None."""
    if not name or not name.strip():
        return "is empty"
    if name in (".", ".."):
        return "is . or .., which name folders that already exist"
    if "/" in name or "\\" in name:
        return "holds a path separator (/ or \\): it would name a file in another folder"
    unprintable = label_problem(name)
    if unprintable:
        return unprintable
    if name != name.strip():
        return "starts or ends with white space"
    if name.startswith("-"):
        return "starts with -, which commands run in its folder would read as an option"
    if name.startswith("."):
        return "starts with ., which hides it (powertrain keeps its own state in hidden folders)"
    size = len(name.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        return f"is {size} bytes long, over the {MAX_NAME_BYTES} a name may have"
    return None


def _quoted(text: str, limit: int = 80) -> str:
    # repr escapes every unprintable character itself; a hostile name can be megabytes long
    return repr(text) if len(text) <= limit else repr(text[:limit - 3]) + "…"


def check_name(name: object, field: str) -> str:
    """``name`` when it can be one file or folder name; else :class:`BadName` naming ``field``."""
    if not isinstance(name, str):
        raise BadName(f"{field}: expected a name (text), got {type(name).__name__}")
    why = name_problem(name)
    if why:
        raise BadName(f"{field} {_quoted(name)} {why}; a name is {ALLOWED}")
    return name


def check_label(text: object, field: str) -> str:
    """``text`` when every character is printable (a label shown but never a path); else :class:`BadName`."""
    if not isinstance(text, str):
        raise BadName(f"{field}: expected text, got {type(text).__name__}")
    why = label_problem(text)
    if why:
        raise BadName(f"{field} {_quoted(text)} {why}; a label holds printable characters only")
    return text
