"""Names are labels, not paths or commands; files are regular files (issue 29, Deliver 5 and 6).

One table of hostile inputs through the CLI (:data:`CASES`): a name that would become a path outside its
folder (``import --host ../../x``, a spec ``name: /abs/x``), a FIFO where a spec, ``run.json``, telemetry
or events file belongs (each hung its command before), and ``monitor``/``run --out`` at a sweep folder.
Each case asserts the exit code, exactly one line on stderr naming the file or field, no traceback, every
file that was there before byte-identical (sha256), and nothing created outside the command's target (the
whole tree listed before and after). A FIFO case cannot hang the suite if the fix regresses: a watchdog
thread opens the FIFO's write end if the command still runs after :data:`FIFO_LIMIT_S` — the reader then
sees end-of-file and the case fails saying it waited.

:data:`ESCAPES` runs commands over runs whose names hold terminal escape sequences and bidi overrides:
the output holds their escapes (``\\x1b``, ``\\u202e``), never the characters themselves.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from powertrain.analyze.synthetic import write_run, write_sweep
from powertrain.cli import app
from powertrain.core.files import NotRegularFile, file_kind, open_regular, require_regular_file
from powertrain.core.names import MAX_NAME_BYTES, BadName, check_label, check_name, printable
from powertrain.core.yamlfile import load_yaml_file
from powertrain.store.rundir import RunDir, read_json
from powertrain.store.tables import read_events, read_telemetry, telemetry_files
from powertrain.store.targets import WriteRefused, check_new_run_dir
from powertrain.store.validate import validate_run

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")

FIFO_LIMIT_S = 30.0  # how long a command may wait on a FIFO before the watchdog writes its end

RUN_SPEC = """\
name: {name}
model: llama3-tiny
layout: {{tp: 1, pp: 1}}
knobs: {{micro_batch: 1, global_batch: 2, recompute: none, precision: fp32}}
hardware: {{nodes: 1, devices_per_node: 2, device: cpu}}
protocol: {{warmup_steps: 1, measured_steps: 2}}
"""

NVSMI = "timestamp, index, power.draw [W], temperature.gpu\n" + "".join(
    f"2024/05/01 10:00:{s:02d}.000, 0, 300.0 W, 60\n" for s in range(10))

# characters a name must not smuggle onto a terminal: clear screen, retitle (OSC … BEL), bidi controls
HOSTILE_CHARS = ("\x1b", "\x07", "\x9b", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069", "\u200e", "\u200f")
HOSTILE_NAME = "ev\x1b[2Jil\x1b]0;owned\x07\u202egpj.exe\u2066x\u2069\u200f"


@dataclass(frozen=True)
class Hostile:
    """A built input: the command line, what its one stderr line names, its exit code, the paths (relative
    to the case's folder) where it may create files, and the FIFOs it must not wait on."""

    argv: list[str]
    names: tuple[str, ...]
    code: int = 2
    may_write: tuple[str, ...] = ()
    fifos: tuple[Path, ...] = ()


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[Path], Hostile]


# --- names that would become paths ----------------------------------------------------------------


def _import_host(*hosts: str, files: int = 1) -> Callable[[Path], Hostile]:
    def make(tmp: Path) -> Hostile:
        (tmp / "imp").mkdir()
        sources = []
        for i in range(files):
            (tmp / f"g{i}.csv").write_text(NVSMI)
            sources.append(str(tmp / f"g{i}.csv"))
        opts = [f"--host={h.replace('{tmp}', str(tmp))}" for h in hosts]
        return Hostile(["import", "nvsmi", *sources, "--out", str(tmp / "imp" / "r"), "--tz", "UTC", *opts],
                       ("--host",))
    return make


def _run_check(name: str, *options: str, names: tuple[str, ...] = ("name",)) -> Callable[[Path], Hostile]:
    def make(tmp: Path) -> Hostile:
        spec = tmp / "spec.yaml"
        spec.write_text(RUN_SPEC.format(name=json.dumps(name.replace("{tmp}", str(tmp)))))
        opts = [o.replace("{tmp}", str(tmp)) for o in options]
        return Hostile(["run", str(spec), "--check", *opts], names)
    return make


def _plan_run_spec(name: str) -> Callable[[Path], Hostile]:
    def make(tmp: Path) -> Hostile:
        spec = tmp / "spec.yaml"
        spec.write_text(RUN_SPEC.format(name=json.dumps(name.replace("{tmp}", str(tmp)))))
        return Hostile(["plan", str(spec)], ("name",))
    return make


NAME_CASES = [
    Case("import-host-dotdot", _import_host("../../x")),
    Case("import-host-absolute", _import_host("{tmp}/elsewhere")),
    Case("import-host-dot", _import_host(".")),
    Case("import-host-dotdot-alone", _import_host("..")),
    Case("import-host-empty", _import_host("")),
    Case("import-host-backslash", _import_host("a\\b")),
    Case("import-host-escape", _import_host("a\x1b[2Jb")),
    Case("import-host-bidi", _import_host("gpj\u202eexe")),
    Case("import-host-dash", _import_host("-rf")),
    Case("import-host-hidden", _import_host(".hidden")),
    Case("import-host-too-long", _import_host("h" * (MAX_NAME_BYTES + 1))),
    Case("import-second-host-bad", _import_host("node0", "../n1", files=2)),
    Case("run-name-absolute", _run_check("{tmp}/abs/x")),
    Case("run-name-nested", _run_check("sub/dir")),
    Case("run-name-dotdot", _run_check("..")),
    Case("run-name-escape", _run_check("a\x1b[2Jb")),
    Case("run-name-bidi", _run_check("x\u202ey", "--out", "{tmp}/r")),  # a label, with --out too
    Case("run-host-dotdot", _run_check("ok", "--out", "{tmp}/r", "--host", "../x", names=("--host",))),
    Case("plan-run-spec-name-absolute", _plan_run_spec("{tmp}/abs/x")),
]


# --- FIFOs where a file is expected ---------------------------------------------------------------


def _fifo(path: Path) -> Path:
    if path.exists():
        path.unlink()
    os.mkfifo(path)
    return path


def _spec_fifo(command: str) -> Callable[[Path], Hostile]:
    def make(tmp: Path) -> Hostile:
        spec = _fifo(tmp / "spec.yaml")
        argv = {"plan": ["plan", str(spec)], "run": ["run", str(spec), "--check"], "predict": ["predict", str(spec)]}[command]
        return Hostile(argv, ("spec.yaml",), fifos=(spec,))
    return make


def _run_fifo(where: Callable[[Path], Path], command: str, names: str) -> Callable[[Path], Hostile]:
    def make(tmp: Path) -> Hostile:
        run = write_run(tmp / "run", hosts=1, devices_per_host=2, steps=3)
        fifo = _fifo(where(run))
        argv = {"summarize": ["summarize", str(run)],
                "report": ["report", str(run), "--out", str(tmp / "rep"), "--formats", ""],
                "trace": ["trace", str(run), "--out", str(tmp / "trace.json")],
                "compare": ["compare", str(run), str(write_run(tmp / "other", hosts=1, devices_per_host=2, steps=3))],
                }[command]
        return Hostile(argv, (names,), fifos=(fifo,))
    return make


def _telemetry(run: Path) -> Path:
    return run / "telemetry" / "node0.parquet"


def _segment(run: Path) -> Path:
    parts = run / "telemetry" / "node0.parts"
    parts.mkdir()
    return parts / "seg-000000.parquet"


def _events(run: Path) -> Path:
    return run / "events" / "rank-0.parquet"


FIFO_CASES = [
    Case("plan-spec-fifo", _spec_fifo("plan")),
    Case("run-check-spec-fifo", _spec_fifo("run")),
    Case("predict-spec-fifo", _spec_fifo("predict")),
    Case("summarize-telemetry-fifo", _run_fifo(_telemetry, "summarize", "telemetry/node0.parquet")),
    Case("summarize-segment-fifo", _run_fifo(_segment, "summarize", "seg-000000.parquet")),
    Case("summarize-events-fifo", _run_fifo(_events, "summarize", "rank-0.parquet")),
    Case("summarize-run-json-fifo", _run_fifo(lambda r: r / "run.json", "summarize", "run.json")),
    Case("trace-events-fifo", _run_fifo(_events, "trace", "rank-0.parquet")),
    Case("trace-run-json-fifo", _run_fifo(lambda r: r / "run.json", "trace", "run.json")),
    Case("report-telemetry-fifo", _run_fifo(_telemetry, "report", "telemetry/node0.parquet")),
    Case("compare-events-fifo", _run_fifo(_events, "compare", "rank-0.parquet")),
]


# --- monitor / run --out at a sweep ---------------------------------------------------------------


def _out_case(command: str, where: Callable[[Path], Path], names: str) -> Callable[[Path], Hostile]:
    def make(tmp: Path) -> Hostile:
        out = where(tmp)
        if command == "monitor":
            return Hostile(["monitor", "-q", "--out", str(out), "--", "true"], (names,))
        spec = tmp / "spec.yaml"
        spec.write_text(RUN_SPEC.format(name="ok"))
        return Hostile(["run", str(spec), "--check", "--out", str(out)], (names,))
    return make


def _sweep(tmp: Path) -> Path:
    return write_sweep(tmp / "sw")


OUT_CASES = [
    Case("monitor-out-sweep", _out_case("monitor", _sweep, "sweep folder")),
    Case("monitor-out-sweep-specs", _out_case("monitor", lambda t: _sweep(t) / ".specs", ".specs")),
    Case("monitor-out-sweep-json", _out_case("monitor", lambda t: _sweep(t) / "sweep.json", "sweep.json")),
    Case("monitor-out-run-telemetry", _out_case("monitor", lambda t: write_run(t / "run", devices_per_host=1,
                                                                               steps=2) / "telemetry", "telemetry")),
    Case("monitor-out-inside-run", _out_case("monitor", lambda t: write_run(t / "run", devices_per_host=1,
                                                                            steps=2) / "sub", "inside the run")),
    Case("run-check-out-sweep", _out_case("run", _sweep, "sweep folder")),
]

CASES = NAME_CASES + FIFO_CASES + OUT_CASES


# --- running --------------------------------------------------------------------------------------


def tree(root: Path) -> set[str]:
    """Every entry under ``root`` (folders, files, FIFOs, links), by relative path."""
    out: set[str] = set()
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            out.add(str((Path(dirpath) / name).relative_to(root)))
    return out


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every regular file under ``root`` (FIFOs and links are not opened)."""
    out: dict[str, str] = {}
    for rel in tree(root):
        p = root / rel
        if p.is_file() and not p.is_symlink():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@contextlib.contextmanager
def fifo_watchdog(fifos: tuple[Path, ...]) -> Iterator[list[Path]]:
    """While the block runs, every :data:`FIFO_LIMIT_S` open (and close) the write end of each FIFO a reader
    waits on, so a command that opened one sees end-of-file instead of hanging; yields the FIFOs it had to
    open (empty: nothing waited). A command that ends at once ends the watch at once."""
    done = threading.Event()
    opened: list[Path] = []

    def watch() -> None:
        while not done.wait(FIFO_LIMIT_S):
            for f in fifos:
                try:
                    fd = os.open(f, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: nobody is reading it
                except OSError:
                    continue
                opened.append(f)
                os.close(fd)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield opened
    finally:
        done.set()
        thread.join()


def invoke(argv: list[str], cwd: Path) -> tuple[int, str, str]:
    old = Path.cwd()
    os.chdir(cwd)
    try:
        res = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    finally:
        os.chdir(old)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import traceback

        return res.exit_code, res.stdout, res.stderr + "\nTraceback:\n" + "".join(
            traceback.format_exception(res.exception))
    return res.exit_code, res.stdout, res.stderr


def problems_of(h: Hostile, code: int, out: str, err: str, before: tuple[set[str], dict[str, str]],
                after: tuple[set[str], dict[str, str]], waited: list[Path]) -> list[str]:
    """Every broken promise of one case (none: it passes)."""
    problems = []
    if code != h.code:
        problems.append(f"exit code {code}, expected {h.code}")
    if "Traceback" in err or "Traceback" in out:
        problems.append("a traceback")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if len(lines) != 1:
        problems.append(f"{len(lines)} lines on stderr, not one")
    elif not any(n in lines[0] for n in h.names):
        problems.append(f"the error line does not name {' or '.join(map(repr, h.names))}")
    if any(c in err + out for c in HOSTILE_CHARS):
        problems.append("an escape or bidi character printed raw")
    changed = [p for p, d in before[1].items() if after[1].get(p) != d]
    if changed:
        problems.append(f"pre-existing files changed: {', '.join(sorted(changed)[:5])}")
    removed = before[0] - after[0]
    added = [p for p in after[0] - before[0] if not any(p == w or p.startswith(w + "/") for w in h.may_write)]
    if removed or added:
        problems.append(f"tree changed: removed {sorted(removed)[:5]}, added outside the target {sorted(added)[:5]}")
    if waited:
        problems.append(f"waited on a FIFO for {FIFO_LIMIT_S:g} s: {', '.join(map(str, waited))}")
    return problems


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_name_or_file_is_one_line_and_harms_nothing(case: Case, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    h = case.make(work)
    before = (tree(tmp_path), snapshot(tmp_path))
    with fifo_watchdog(h.fifos) as waited:
        code, out, err = invoke(h.argv, work)
    after = (tree(tmp_path), snapshot(tmp_path))
    problems = problems_of(h, code, out, err, before, after, waited)
    assert not problems, f"{case.id}: {'; '.join(problems)}\nstderr:\n{err[-2000:]}\nstdout:\n{out[-1000:]}"


def test_a_fifo_spec_through_the_console_script_ends(tmp_path: Path) -> None:
    """The real process, as a user runs it: before, `plan FIFO` waited for a writer for ever."""
    spec = _fifo(tmp_path / "spec.yaml")
    exe = Path(sys.executable).with_name("powertrain")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "powertrain.cli"]
    with fifo_watchdog((spec,)) as waited:
        res = subprocess.run([*cmd, "plan", str(spec)], capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert not waited and res.returncode == 2, res.stderr
    assert res.stderr.strip().count("\n") == 0 and "spec.yaml: is a FIFO (named pipe), not a regular file" in res.stderr


# --- escaped on output ----------------------------------------------------------------------------


def _escape_run(tmp: Path) -> list[str]:
    run = write_run(tmp / "run", hosts=2, devices_per_host=1, steps=3, name=HOSTILE_NAME)
    return ["summarize", str(run)]


def _escape_sweep(tmp: Path) -> list[str]:
    sweep = write_sweep(tmp / "sw")
    info = json.loads((sweep / "sweep.json").read_text())
    info["runs"][4]["id"] = "\x1b[2J\u202eid"  # a rejected run: shown in the table, never a folder
    info["runs"][4]["reason"] = HOSTILE_NAME
    (sweep / "sweep.json").write_text(json.dumps(info))
    return ["summarize", str(sweep)]


def _escape_compare(tmp: Path) -> list[str]:
    a = write_run(tmp / "a", devices_per_host=1, steps=3, name=HOSTILE_NAME)
    b = write_run(tmp / "b", devices_per_host=1, steps=3, name="b" + HOSTILE_NAME)
    return ["compare", str(a), str(b)]


def _escape_error_line(tmp: Path) -> list[str]:
    run = write_run(tmp / f"r{HOSTILE_NAME}", devices_per_host=1, steps=2)
    (run / "run.json").write_text("{not json")
    return ["summarize", str(run)]


# (id, builder, exit code)
ESCAPES: list[tuple[str, Callable[[Path], list[str]], int]] = [
    ("summarize-run-name", _escape_run, 0),
    ("summarize-sweep-run-id", _escape_sweep, 0),
    ("compare-run-names", _escape_compare, 0),
    ("damaged-run-folder-name", _escape_error_line, 2),
]


@pytest.mark.parametrize(("build", "code"), [(b, c) for _, b, c in ESCAPES], ids=[i for i, _, _ in ESCAPES])
def test_escape_sequences_and_bidi_overrides_are_shown_escaped(build: Callable[[Path], list[str]], code: int,
                                                               tmp_path: Path) -> None:
    argv = build(tmp_path)
    got, out, err = invoke(argv, tmp_path)
    assert got == code, err
    raw = [c for c in HOSTILE_CHARS if c in out + err]
    assert not raw, f"printed raw: {raw!r}\n{out}{err}"
    text = (out + err).replace("\n", "")  # rich may fold a long name over lines
    assert "\\x1b" in text and "\\u202e" in text, out + err


# --- the validators themselves --------------------------------------------------------------------

GOOD_NAMES = ["node0", "gpu-01.cluster", "run_1+2", "Ünïcode-名前", "a b", "x" * MAX_NAME_BYTES, "a.b."]
BAD_NAMES = [("", "empty"), ("   ", "empty"), (".", ". or .."), ("..", ". or .."), ("a/b", "separator"),
             ("/abs", "separator"), ("a\\b", "separator"), ("a\x00b", "unprintable"), ("a\nb", "unprintable"),
             ("a\x1b[2J", "unprintable"), ("a\x9bb", "unprintable"), ("gpj\u202eexe", "unprintable"),
             ("a\u2066b", "unprintable"), ("a\u200fb", "unprintable"), ("a\u2028b", "unprintable"),
             ("a\udcffb", "unprintable"), (" a", "white space"), ("a ", "white space"), ("-rf", "starts with -"),
             (".hidden", "starts with ."), ("é" * (MAX_NAME_BYTES // 2 + 1), "bytes long")]


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_a_plain_name_passes(name: str) -> None:
    assert check_name(name, "host") == name


@pytest.mark.parametrize(("name", "why"), BAD_NAMES, ids=[repr(n)[:30] for n, _ in BAD_NAMES])
def test_a_name_that_is_not_one_path_component_is_refused_naming_the_field(name: str, why: str) -> None:
    with pytest.raises(BadName) as exc:
        check_name(name, "--host")
    line = str(exc.value)
    assert line.startswith("--host ") and why in line and "a name is one path component" in line
    assert line.isprintable(), line  # the refusal itself shows the name escaped


def test_a_label_may_hold_slashes_but_no_controls() -> None:
    assert check_label("study/llama/tp2", "name") == "study/llama/tp2"
    with pytest.raises(BadName, match="unprintable"):
        check_label("a\u202eb", "name")


def test_printable_escapes_controls_and_bidi_and_keeps_the_rest() -> None:
    assert printable("plain Ünïcode 名前 → ok") == "plain Ünïcode 名前 → ok"
    assert printable("a\x1b[2Jb\x07\u202e\u2066\n") == "a\\x1b[2Jb\\x07\\u202e\\u2066\\n"
    assert printable(Path("x")) == "x"


def test_the_store_refuses_a_host_or_rank_that_is_a_path(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r")
    assert run.telemetry_file("node0").name == "node0.parquet"
    for host in ("../../x", "/abs", "", ".."):
        with pytest.raises(BadName, match="host"):
            run.telemetry_file(host)
        with pytest.raises(BadName, match="host"):
            run.telemetry_meta(host)
    assert run.events_file(-1).name == "rank--1.parquet"  # detected events' pseudo-rank
    with pytest.raises(TypeError):
        run.events_file("../../x")  # type: ignore[arg-type]


def test_check_new_run_dir(tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "sw")
    assert check_new_run_dir(tmp_path / "new") == tmp_path / "new"
    assert check_new_run_dir(sweep / "tp1pp1") == sweep / "tp1pp1"  # a sweep's run: the sweep runner's --out
    for bad in (sweep, sweep / ".specs", sweep / "sweep.json", sweep / "tp1pp1" / "telemetry", sweep / "tp1pp1" / "x"):
        with pytest.raises(WriteRefused):
            check_new_run_dir(bad)


# --- regular files: the checks themselves ---------------------------------------------------------


def test_require_regular_file_names_what_it_is(tmp_path: Path) -> None:
    fifo = _fifo(tmp_path / "f")
    (tmp_path / "reg").write_text("x")
    require_regular_file(tmp_path / "reg")
    cases = [(fifo, "a FIFO (named pipe)"), (tmp_path, "a directory")]
    if Path("/dev/null").exists():
        cases.append((Path("/dev/null"), "a character device"))
    for path, kind in cases:
        with pytest.raises(NotRegularFile, match=re.escape(f"{path}: is {kind}, not a regular file; give the spec as")):
            require_regular_file(path, "the spec")
        with pytest.raises(NotRegularFile, match=re.escape(f"is {kind}")):
            open_regular(path)  # opened without blocking, checked on the open file
    assert file_kind(os.stat(fifo).st_mode) == "a FIFO (named pipe)"
    with pytest.raises(FileNotFoundError):
        require_regular_file(tmp_path / "missing")


def test_readers_refuse_or_skip_a_fifo_without_opening_it(tmp_path: Path) -> None:
    """Called directly, without the command-level check: a FIFO is refused (a stream's file, run.json,
    a YAML file) or skipped (a segment, as a torn one is), never waited on."""
    run = write_run(tmp_path / "run", hosts=1, devices_per_host=1, steps=2)
    seg = _segment(run)
    _fifo(seg)
    fifos = (seg, _fifo(_events(run)), _fifo(tmp_path / "x.yaml"), _fifo(tmp_path / "x.json"))
    with fifo_watchdog(fifos) as waited:
        assert read_telemetry(run).num_rows > 0  # the compacted file is read, the FIFO segment skipped
        assert telemetry_files(run) == [_telemetry(run)]
        with pytest.raises(NotRegularFile, match=re.escape("rank-0.parquet: is a FIFO")):
            read_events(run)
        with pytest.raises(NotRegularFile, match=re.escape("x.yaml: is a FIFO")):
            load_yaml_file(tmp_path / "x.yaml")
        with pytest.raises(NotRegularFile, match=re.escape("x.json: is a FIFO")):
            read_json(tmp_path / "x.json")
        problems = {p.file: p.problem for p in validate_run(run)}
    assert not waited
    assert problems == {"events/rank-0.parquet": "is a FIFO (named pipe), not a regular file",
                        "telemetry/node0.parts/seg-000000.parquet": "is a FIFO (named pipe), not a regular file"}


def test_a_run_id_from_many_long_axis_values_stays_one_folder_name() -> None:
    """A grid's run id names a folder: however many long values it joins, it stays a valid name, and two
    long ids that differ only past the cut stay distinct."""
    from powertrain.core.names import name_problem
    from powertrain.plan.planner import MAX_RUN_ID, run_id

    a = run_id({"model": "m" * 300, "layout.tp": 2})
    b = run_id({"model": "m" * 300, "layout.tp": 4})
    assert len(a) <= MAX_RUN_ID and name_problem(a) is None
    assert a != b
    assert run_id({"model": "gpt3-175b", "layout.tp": 2}) == "gpt3-175b.tp2"


def test_the_html_report_shows_control_and_bidi_characters_of_a_name_as_escapes(tmp_path: Path) -> None:
    """A run name holding a right-to-left override and an escape sequence reaches the report's HTML as
    visible escapes (html.escape alone leaves U+202E, which reverses what a reader sees)."""
    from powertrain.analyze.synthetic import write_run
    from powertrain.report.build import build_report

    run = write_run(tmp_path / "run", hosts=1, devices_per_host=1, steps=2)
    info = json.loads((run / "run.json").read_text())
    info["name"] = "run\u202etxt.exe\x1b[2J"
    (run / "run.json").write_text(json.dumps(info))
    out = build_report(run, tmp_path / "rep", formats=())
    page = Path(out).read_text(encoding="utf-8")  # build_report returns the HTML path
    assert "\u202e" not in page and "\x1b" not in page
    assert "\\u202e" in page
