"""Sweep state on disk: ``<sweep>/sweep.json`` and its change log, the lock that keeps two sweeps apart,
and resume.

``sweep.json`` is the record of a sweep: every planned, rejected and duplicate run with its status,
reason, configuration and axes. It is written whole when the sweep starts (merged with the state on
disk) and when it ends; in between, each change is one line appended to ``sweep.state.jsonl``
(:mod:`powertrain.store.sweep_log`), which every reader replays — a grid of 100 000 points no longer
rewrites hundreds of MB after each run. A Ctrl-C or a crash at any moment leaves a readable state:
the last compaction plus every change logged since (a line torn by the crash is ignored). Statuses
of runs::

    planned ─► running ─► ok | failed | oom        rejected, duplicate: never launched

On resume, a run found ``running`` was interrupted: it is re-run (its partial directory is moved to
``.attempts/``) or marked failed, as the user chooses. Finished runs are never re-run, so the final
set of run directories is exactly the set of launched runs. A resume whose spec gives a run it keeps
another configuration than the one it ran with is refused (:class:`SpecChanged`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from powertrain.plan.planner import Plan
from powertrain.store.rundir import default_host, file_mode, make_dir
from powertrain.store.sweep_log import GENERATION, append_change, read_sweep, write_compacted
from powertrain.store.targets import refuse_link

FINISHED = ("ok", "failed", "oom")


class SweepLocked(RuntimeError):
    """Another sweep is running on this results folder."""


@contextlib.contextmanager
def sweep_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``folder`` for the duration of a sweep (released on any exit).

    The folder and the lock file take the project's modes (:mod:`powertrain.store.rundir`); a link at
    ``.lock`` is refused (:class:`powertrain.store.targets.WriteRefused`), never truncated through."""
    make_dir(folder)
    path = folder / ".lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, file_mode())
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            refuse_link(path)
        raise
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Path(path).read_text().strip() or "unknown process"
            raise SweepLocked(
                f"another sweep is already running on {folder} ({holder}); wait for it to finish, "
                "or give this sweep a different results folder"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {default_host()} since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode())
        yield
    finally:
        os.close(fd)  # closing releases the flock


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class SpecChanged(RuntimeError):
    """A finished run of the sweep on disk ran with another configuration than the spec now gives it."""


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for k, v in value.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _check_unchanged(folder: Path, plan: Plan, previous: dict[str, dict[str, Any]], rerun: Collection[str]) -> None:
    """Refuse to merge an edited spec into a sweep whose kept runs ran with the old one.

    Kept as they are, those runs would sit in sweep.json under the new configuration they never ran with,
    and the sweep would compare runs that differ in more than its axes."""
    changed = []
    for pr in plan.runs:
        prev = previous.get(pr.id)
        if (pr.status != "planned" or pr.config is None or not prev or not isinstance(prev.get("config"), dict)
                or prev.get("status") not in (*FINISHED, "running") or prev.get("status") in rerun):
            continue
        was, now = _flat(prev["config"]), _flat(pr.config.model_dump(mode="json"))
        # only settings both record: one a newer powertrain added (at its default) is not an edit of the spec
        diff = [k for k in was if k in now and was[k] != now[k]]
        if diff:
            changed.append((pr.id, diff[0], was[diff[0]], now[diff[0]]))
    if changed:
        rid, key, was_v, now_v = changed[0]
        others = [c[0] for c in changed[1:]]
        named = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        more = f" ({named} differ{'s' if len(others) == 1 else ''} too)" if others else ""
        raise SpecChanged(f"{folder / 'sweep.json'}: run {rid} ran with {key} {was_v!r}, the spec now says "
                          f"{now_v!r}{more}; resume with the spec the sweep started with, or start a new --out")


class SweepState:
    """The runs of one sweep folder and their statuses: ``sweep.json`` plus its change log."""

    def __init__(self, folder: Path, data: dict[str, Any]) -> None:
        self.folder = folder
        self.data = data
        self._index = {r["id"]: r for r in data.get("runs", [])}  # run() in constant time, not a scan

    @property
    def path(self) -> Path:
        return self.folder / "sweep.json"

    @property
    def runs(self) -> list[dict[str, Any]]:
        return self.data["runs"]

    def run(self, run_id: str) -> dict[str, Any]:
        if len(self._index) != len(self.runs):  # runs added to the list directly
            self._index = {r["id"]: r for r in self.runs}
        return self._index[run_id]

    def save(self) -> None:
        """Write sweep.json whole with every change folded in, and drop the change log (atomically, the
        project's file mode; a link planted there is refused)."""
        self.data["updated"] = _now()
        write_compacted(self.folder, self.data)

    def set(self, run_id: str, **fields: Any) -> None:
        """Change fields of one run: in memory, and one line appended to the change log."""
        self.run(run_id).update(fields)
        self.data["updated"] = _now()
        append_change(self.folder, {"id": run_id, "set": fields, "updated": self.data["updated"]},
                      self.data.get(GENERATION, 0))

    def note(self, **fields: Any) -> None:
        """Change keys of the sweep record itself (``idle_baseline``), logged as :meth:`set` logs."""
        self.data.update(fields)
        self.data["updated"] = _now()
        append_change(self.folder, {"top": fields, "updated": self.data["updated"]}, self.data.get(GENERATION, 0))

    @classmethod
    def load(cls, folder: Path) -> SweepState | None:
        data = read_sweep(folder)
        return cls(folder, data) if data is not None else None

    @classmethod
    def create_or_merge(cls, folder: Path, plan: Plan, rerun: Collection[str] = ()) -> SweepState:
        """A state for ``plan``: new, or merged with the one on disk (statuses of known runs kept).

        ``rerun``: the statuses the caller runs again (``--retry-failed``, ``--interrupted rerun``). Every
        other launched run stays as it ran, so its configuration must be the plan's: :class:`SpecChanged`
        when not, raised before sweep.json is touched."""
        old = cls.load(folder)
        previous = {r["id"]: r for r in old.runs} if old else {}
        _check_unchanged(folder, plan, previous, rerun)
        runs = []
        for pr in plan.runs:
            entry = pr.to_dict()
            prev = previous.get(pr.id)
            if prev and pr.status == "planned" and prev.get("status") in (*FINISHED, "running"):
                for key in ("status", "reason", "attempts", "started", "ended", "exit_code", "retries"):
                    if key in prev:
                        entry[key] = prev[key]
            if pr.status != "planned":
                entry["reason"] = "; ".join(pr.reasons)
            runs.append(entry)
        state = cls(folder, {
            "schema": "powertrain.sweep/1",
            "name": plan.spec.name,
            "spec": plan.spec.model_dump(mode="json"),
            "runs": runs,
            # past the generation on disk: a change log left by a killed sweep is never replayed twice
            GENERATION: old.data.get(GENERATION, 0) if old else 0,
            **({"idle_baseline": old.data["idle_baseline"]} if old and "idle_baseline" in old.data else {}),
        })
        state.save()
        return state

    def archive_attempt(self, run_id: str) -> Path | None:
        """Move a run's existing directory aside (to ``.attempts/``) before it is run again."""
        src = self.folder / run_id
        if not src.exists():
            return None
        dest_root = make_dir(refuse_link(self.folder / ".attempts"))  # a link would move the run out of the sweep
        n = 1
        while (dest_root / f"{run_id}.{n}").exists():
            n += 1
        dest = dest_root / f"{run_id}.{n}"
        shutil.move(str(src), dest)
        return dest
