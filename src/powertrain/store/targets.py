"""Where a command may write: never into or over a run's own files, never outside its folder.

Every command that writes (``predict --out``, ``trace -o``, ``report``, ``summarize``, ``import --out``,
``calibrate --name``) asks here first. The rules (docs/reliability.md):

* a run directory's own files — ``run.json``, ``summary.json``, ``telemetry/``, ``events/``,
  ``logs/`` — and a sweep folder's ``sweep.json``, ``summary.parquet`` and hidden state folders are
  never a target of another command, ``--force`` or not;
* an existing target is replaced only with ``--force`` *and* when it is of the same kind (a
  prediction over a prediction, a trace over a trace, an import over an import, a calibration
  profile over a profile); a measured run is never replaced;
* a new run directory is never created inside another run directory;
* names given on the command line (``--name``, run names that become folder names) are one path
  component (:func:`powertrain.core.names.check_name`, the one rule: no ``/`` or ``\\``, not ``.`` or
  ``..``, not empty, only printable characters, no leading ``-`` or ``.``, at most 200 bytes);
* ``monitor --out`` / ``run --out`` never make a run of a sweep folder (its runs would be hidden
  inside a run) or of a sweep's or run's own files (:func:`check_new_run_dir`).

A refusal is a :class:`WriteRefused` (a ``ValueError``) whose message is one line naming the path.

A sweep never writes its folder's files, nor ``calibrate`` its profile, through a symbolic link
(:func:`refuse_link`): a link planted where a sweep keeps its own files would otherwise make the
next write land on the link's target, anywhere the user can write.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path

from powertrain.core.names import BadName
from powertrain.core.names import check_name as _check_name

RUN_FILES = frozenset({"run.json", "summary.json"})
RUN_FOLDERS = frozenset({"telemetry", "events", "logs"})
SWEEP_FILES = frozenset({"sweep.json", "sweep.state.jsonl", "summary.parquet", ".lock"})
SWEEP_FOLDERS = frozenset({".specs", ".launch", ".attempts", ".baseline"})


class WriteRefused(FileExistsError, ValueError):
    """A write that would overwrite data or land outside its folder; the message is one line.

    Both an ``OSError`` (``FileExistsError``, what refusing an existing target always raised) and a
    ``ValueError`` (an invalid option value), so either handler of a caller catches it."""


def refuse_link(path: str | os.PathLike[str]) -> Path:
    """``path`` when it is not a symbolic link; else :class:`WriteRefused` naming it (the target is left alone)."""
    p = Path(path)
    if p.is_symlink():
        try:
            target = f" (to {os.readlink(p)!r})"
        except OSError:
            target = ""
        raise WriteRefused(f"{p} is a symbolic link{target}; powertrain does not write through links: remove the "
                           "link (the file is written afresh), or use another folder")
    return p


def _a(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


def check_name(name: str, what: str) -> str:
    """``name`` if it is one safe path component (:func:`powertrain.core.names.check_name`); else
    :class:`WriteRefused` naming ``what``."""
    try:
        return _check_name(name, what)
    except BadName as exc:
        raise WriteRefused(str(exc)) from None


def check_path_text(path: str | os.PathLike[str], what: str) -> Path:
    """A path option that names a folder to create: not empty, not ``.``, no NUL or newline."""
    text = os.fspath(path)
    if not text.strip() or Path(text) == Path("."):
        raise WriteRefused(f"{what} {text!r}: give a folder name (the current directory is not a new run directory)")
    if any(c in text for c in ("\x00", "\n", "\r")):
        raise WriteRefused(f"{what} {text!r} contains a NUL or newline")
    return Path(text)


def _is_run_dir(p: Path) -> bool:
    return (p / "run.json").is_file()


def _is_sweep_dir(p: Path) -> bool:
    return (p / "sweep.json").is_file()


def check_new_run_dir(out: str | os.PathLike[str], option: str = "--out") -> Path:
    """``out`` when ``monitor``/``run`` may make a run directory there: not a sweep folder (a folder holding
    ``sweep.json`` is a sweep, not a run: made a run, its runs would be hidden under it), not a sweep's or a
    run's own file or folder (``sweep.json``, ``.specs/``, ``telemetry/``, …), not inside a run directory.
    Else :class:`WriteRefused`, one line naming the folder. An existing run there is the caller's to judge
    (the other nodes of a run, and srun's tasks, join it)."""
    p = Path(out)
    if _is_sweep_dir(p):
        raise WriteRefused(f"{option} {p}: is a sweep folder (it holds sweep.json), not a run; a run made there "
                           f"would hide the sweep's runs — pick a new {option} folder")
    prot = protected_reason(p)
    if prot and not _is_run_dir(p):
        raise WriteRefused(f"{option} {p}: {prot}; pick a new {option} folder")
    if (inside := enclosing_run(p)) is not None:
        raise WriteRefused(f"{option} {p}: inside the run directory {inside}; pick a folder outside it")
    return p


def enclosing_run(path: str | os.PathLike[str]) -> Path | None:
    """The run directory that ``path`` lies inside (not counting ``path`` itself), if any."""
    p = Path(path).absolute()
    for parent in p.parents:
        if _is_run_dir(parent):
            return parent
    return None


def protected_reason(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` is a run's or sweep's own file or folder (never a command's output), else None."""
    p = Path(os.path.abspath(path))
    chain = [p, *p.parents]
    for child, parent in itertools.pairwise(chain):
        if _is_run_dir(parent) and (child.name in RUN_FILES or child.name in RUN_FOLDERS):
            return f"it is part of the run {parent} ({child.name})"
        if _is_sweep_dir(parent) and (child.name in SWEEP_FILES or child.name in SWEEP_FOLDERS):
            return f"it is part of the sweep {parent} ({child.name})"
    if _is_run_dir(p):
        return f"it is the run directory {p}"
    if _is_sweep_dir(p):
        return f"it is the sweep folder {p}"
    return None


def run_kind(path: Path) -> str | None:
    """``prediction``, ``import`` or ``measured`` (anything else: train, monitor, none) for the run directory
    at ``path``; ``unreadable`` for a run.json that cannot be read; None if not a run."""
    if not _is_run_dir(path):
        return None
    try:
        info = json.loads((path / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "unreadable"
    kind = info.get("kind") if isinstance(info, dict) else None
    return kind if kind in ("prediction", "import") else "measured"  # train, monitor, none: measured


def check_run_target(out: str | os.PathLike[str], kind: str, *, force: bool, option: str = "--out") -> Path:
    """A run directory of ``kind`` may be written at ``out``: new, empty, or (``force``) a run of the same kind.

    Returns ``out``. Refuses (``WriteRefused``): a run of another kind even with ``force`` (a
    measured run is never replaced), an existing run of the same kind without ``force``, a non-empty
    folder that is no run, a file, and a folder inside another run or a sweep's own files.
    """
    p = Path(out)
    if (inside := enclosing_run(p)) is not None:
        raise WriteRefused(f"{option} {p}: inside the run directory {inside}; choose a folder outside it")
    prot = protected_reason(p)
    if prot and not _is_run_dir(p):
        raise WriteRefused(f"{option} {p}: {prot}; choose another folder")
    if not p.exists() and not p.is_symlink():
        return p
    if not p.is_dir():
        raise WriteRefused(f"{option} {p}: exists and is not a folder; choose a new {option} folder")
    existing = run_kind(p)
    if existing is None:
        if any(p.iterdir()):
            raise WriteRefused(f"{option} {p}: already exists, is not empty and holds no run; "
                           f"choose a new {option} folder")
        return p
    if existing != kind:
        raise WriteRefused(f"{option} {p}: already exists and holds {_a(existing)} run, not {_a(kind)}; it is never "
                           f"replaced (--force replaces only a run of the same kind); choose a new {option} folder")
    if not force:
        raise WriteRefused(f"{option} {p}: already exists and holds {_a(kind)} run; choose a new {option} folder, "
                           "or --force to replace it")
    return p


def check_output_file(path: str | os.PathLike[str], kind: str, *, force: bool,
                      same_kind: Callable[[Path], bool], option: str = "-o") -> Path:
    """A file of ``kind`` may be written at ``path``: new, or (``force``) an existing file of the same kind."""
    p = Path(path)
    prot = protected_reason(p)
    if prot:
        raise WriteRefused(f"{option} {p}: {prot}; write the {kind} elsewhere")
    if p.is_dir():
        raise WriteRefused(f"{option} {p}: is a folder; give a file name")
    if not p.exists() and not p.is_symlink():
        return p
    if not force:
        raise WriteRefused(f"{option} {p}: already exists; choose a new name, or --force to replace {_a(kind)}")
    if p.is_symlink() or not same_kind(p):
        raise WriteRefused(f"{option} {p}: already exists and is not {_a(kind)} written by powertrain; "
                           "it is never replaced")
    return p


def check_output_folder(path: str | os.PathLike[str], kind: str, *, force: bool,
                        same_kind: Callable[[Path], bool], option: str = "--out") -> Path:
    """A folder of ``kind`` (e.g. a report) may be written at ``path``: new, empty, or (``force``) the same kind."""
    p = Path(path)
    prot = protected_reason(p)
    if prot:
        raise WriteRefused(f"{option} {p}: {prot}; write the {kind} elsewhere")
    if not p.exists() and not p.is_symlink():
        return p
    if not p.is_dir():
        raise WriteRefused(f"{option} {p}: exists and is not a folder")
    if not any(p.iterdir()):
        return p
    if not same_kind(p):
        raise WriteRefused(f"{option} {p}: already exists, is not empty and is not {_a(kind)}; it is never replaced")
    if not force:
        raise WriteRefused(f"{option} {p}: already exists and holds {_a(kind)}; choose a new {option} folder, "
                           "or --force to replace it")
    return p
