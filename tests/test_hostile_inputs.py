"""Hostile inputs, tabulated: every bad spec, monitor option, damaged run directory and bad import
source gives one line on stderr naming the file or field, no traceback, a non-zero exit code where
the input is invalid, and leaves every file that was there before byte-identical (sha256).

The table (:data:`CASES`) is plain data plus small builders, so ``benchmarks/hostile_inputs.py``
runs the same cases and prints the counts for docs/reliability.md. Cases run in-process through
typer's ``CliRunner`` (a few through the real console script, as subprocesses).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import damage as damaged
from powertrain.analyze.synthetic import T0_NS, events_table, write_run
from powertrain.cli import app
from powertrain.diagnostics import LOGGER
from powertrain.schema import EVENTS_SCHEMA

# --------------------------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Hostile:
    """What a builder made: the command line, the text the error line must contain, and whether the
    input is invalid (exit code ≠ 0) or merely odd (exit 0 allowed, e.g. implausible readings)."""

    argv: list[str]
    names: str | tuple[str, ...]  # the error line names one of these (the file, or the field)
    invalid: bool = True
    env: dict[str, str] = field(default_factory=dict)
    # content cases (damaged content that still reads): the command may succeed, but what it found must
    # be said — ``note`` appears in its output, or in the file ``note_in`` (relative to the case folder)
    note: str | tuple[str, ...] = ""
    note_in: str = ""
    absent: tuple[str, ...] = ()  # text that must not reach the output raw (terminal escapes)
    # where new files may appear (relative paths; None: anywhere under the case folder)
    writes_under: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Case:
    id: str
    area: str  # spec | monitor | rundir | import | content
    make: Callable[[Path], Hostile]
    # through the installed console script instead of in-process: a few on purpose, and every case
    # that could exhaust memory or time before its fix lands (run under MEMORY_LIMIT and a timeout)
    subprocess: bool = False
    fixed_by: str = ""  # which part of issue 14 makes it pass, when not this one


# --- spec files -----------------------------------------------------------------------------------

GOOD_RUN = """\
name: tiny
model: llama3-tiny
layout: {tp: 1, pp: 1}
knobs: {micro_batch: 1, global_batch: 2, recompute: none, precision: fp32}
hardware: {nodes: 1, devices_per_node: 2, device: cpu}
protocol: {warmup_steps: 1, measured_steps: 2}
"""

GOOD_SWEEP = """\
name: tiny-sweep
base:
  model: llama3-tiny
  hardware: {nodes: 1, devices_per_node: 2, device: cpu}
  knobs: {global_batch: 4, micro_batch: 1, precision: fp32}
  protocol: {warmup_steps: 1, measured_steps: 2}
grid:
  - knobs.micro_batch: [1, 2]
launch: {backend: slurm, partition: debug, time_limit_min: 5}
"""


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


# (id, file content (str or bytes, None: make a directory, "missing": no file), text the line names)
SPEC_CONTENTS: list[tuple[str, str | bytes | None, str]] = [
    ("malformed-yaml", "name: x\nmodel: [llama3-tiny\nlayout: {tp: 1\n", "{spec}"),
    ("tab-indent", "name: x\nmodel:\n\tname: llama3-tiny\n", "{spec}"),
    ("list-not-mapping", "- model: llama3-tiny\n- layout: {}\n", "{spec}"),
    ("scalar", "just a string\n", "{spec}"),
    ("empty-file", "", "{spec}"),
    ("only-comment", "# nothing here\n", "{spec}"),
    ("non-utf8", b"name: \xff\xfe\xfa\nmodel: llama3-tiny\n", "{spec}"),
    ("nul-byte", b"name: x\x00y\nmodel: llama3-tiny\n", "{spec}"),
    ("directory", None, "{spec}"),
    ("missing", "missing", "{spec}"),
    ("unsafe-tag", "name: x\nmodel: !!python/object/apply:os.system ['touch {tmp}/pwned']\n", "{spec}"),
    ("wrong-type-degree", _replace(GOOD_RUN, "tp: 1", 'tp: "two"'), "tp"),
    ("negative-degree", _replace(GOOD_RUN, "tp: 1", "tp: -2"), "tp"),
    ("zero-degree", _replace(GOOD_RUN, "pp: 1", "pp: 0"), "pp"),
    ("unknown-top-key", GOOD_RUN + "bogus_key: 1\n", "bogus_key"),
    ("unknown-nested-key", _replace(GOOD_RUN, "micro_batch: 1,", "micro_batchh: 1,"), "micro_batchh"),
    ("huge-int", _replace(GOOD_RUN, "global_batch: 2", "global_batch: 100000000000000000000000000000"),
     "global_batch"),
    ("huge-float", _replace(GOOD_RUN, "micro_batch: 1,", "micro_batch: 1e400,"), "micro_batch"),
    ("nan-value", _replace(GOOD_RUN, "micro_batch: 1,", "micro_batch: .nan,"), "micro_batch"),
    ("negative-nodes", _replace(GOOD_RUN, "nodes: 1", "nodes: -1"), "nodes"),
    ("huge-devices", _replace(GOOD_RUN, "devices_per_node: 2", "devices_per_node: 1000000000000"),
     "devices_per_node"),
    ("unknown-device", _replace(GOOD_RUN, "device: cpu", "device: h900x"), "h900x"),
    ("unknown-model", _replace(GOOD_RUN, "model: llama3-tiny", "model: gpt-unknown-9000"), "gpt-unknown-9000"),
    ("model-is-number", _replace(GOOD_RUN, "model: llama3-tiny", "model: 42"), "model"),
    ("bad-precision", _replace(GOOD_RUN, "precision: fp32", "precision: fp7"), "precision"),
    ("over-1MiB", GOOD_RUN + "# " + "x" * (1 << 20) + "\n", "{spec}"),
]

# sweep specs whose Slurm values would reach a generated batch script
SWEEP_CONTENTS: list[tuple[str, str, str]] = [
    ("partition-newline", _replace(GOOD_SWEEP, "partition: debug", 'partition: "debug\\ntouch /tmp/pwned"'),
     "partition"),
    ("account-nul", _replace(GOOD_SWEEP, "partition: debug", 'partition: debug, account: "a\\0b"'), "account"),
    ("slurm-extra-newline", _replace(GOOD_SWEEP, "partition: debug", 'partition: debug, slurm_extra: ["--x=1\\nid"]'),
     "slurm_extra"),
    ("grid-not-list", _replace(GOOD_SWEEP, "  - knobs.micro_batch: [1, 2]", "  knobs.micro_batch: 7"), "grid"),
    ("grid-unknown-axis", _replace(GOOD_SWEEP, "knobs.micro_batch:", "knobs.bogus_axis:"), "bogus_axis"),
]


def _spec_file(tmp: Path, name: str, content: str | bytes | None) -> Path:
    path = tmp / f"{name}.yaml"
    if content == "missing":
        return path
    if content is None:
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content.replace("{tmp}", str(tmp)))
    return path


def _spec_case(name: str, content: str | bytes | None, names: str, command: list[str]) -> Callable[[Path], Hostile]:
    def make(tmp: Path) -> Hostile:
        spec = _spec_file(tmp, name, content)
        argv = [*command, str(spec)] if command[0] != "run" else ["run", str(spec), "--check"]
        return Hostile(argv, (spec.name,) if names == "{spec}" else (spec.name, names))
    return make


# --- monitor options ------------------------------------------------------------------------------


def _monitor(*options: str, names: str, command: tuple[str, ...] = ("true",)) -> Callable[[Path], Hostile]:
    def make(tmp: Path) -> Hostile:
        opts = [o.replace("{tmp}", str(tmp)) for o in options]
        return Hostile(["monitor", "-q", *opts, *(["--", *command] if command else [])], names.replace("{tmp}", str(tmp)))
    return make


@contextlib.contextmanager
def _port_in_use() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield s.getsockname()[1]


def _monitor_port_in_use(tmp: Path) -> Hostile:
    port = int((tmp / ".port").read_text())  # the runner holds it (see HOLD_PORT)
    return Hostile(["monitor", "-q", "--out", str(tmp / "run"), "--prometheus", f"127.0.0.1:{port}", "--", "true"],
                   str(port))


def _monitor_out_is_file(tmp: Path) -> Hostile:
    (tmp / "afile").write_text("precious\n")
    return Hostile(["monitor", "-q", "--out", str(tmp / "afile"), "--", "true"], "afile")


def _monitor_out_is_run(tmp: Path) -> Hostile:
    write_run(tmp / "measured", hosts=1, devices_per_host=1, steps=2)
    return Hostile(["monitor", "-q", "--out", str(tmp / "measured"), "--", "true"], "measured")


def _monitor_out_in_file(tmp: Path) -> Hostile:
    (tmp / "afile").write_text("precious\n")
    return Hostile(["monitor", "-q", "--out", str(tmp / "afile" / "run"), "--", "true"], "afile")


MONITOR: list[tuple[str, Callable[[Path], Hostile]]] = [
    ("rate-text", _monitor("--out", "{tmp}/run", "--rate", "abc", names="--rate")),
    ("rate-zero", _monitor("--out", "{tmp}/run", "--rate", "0", names="rate")),
    ("rate-negative", _monitor("--out", "{tmp}/run", "--rate", "-5", names="rate")),
    ("rate-nan", _monitor("--out", "{tmp}/run", "--rate", "nan", names="rate")),
    ("rate-inf", _monitor("--out", "{tmp}/run", "--rate", "inf", names="rate")),
    ("rate-huge", _monitor("--out", "{tmp}/run", "--rate", "1e9", names="rate")),
    ("out-empty", _monitor("--out", "", names="--out")),
    ("missing-command", _monitor("--out", "{tmp}/run", names="command", command=())),
    ("prometheus-text", _monitor("--out", "{tmp}/run", "--prometheus", "notaport", names="notaport")),
    ("prometheus-port-range", _monitor("--out", "{tmp}/run", "--prometheus", "127.0.0.1:99999", names="99999")),
    ("prometheus-negative", _monitor("--out", "{tmp}/run", "--prometheus", "-1", names="-1")),
    ("port-in-use", _monitor_port_in_use),
    ("backends-unknown", _monitor("--out", "{tmp}/run", "--backends", "bogus", names="bogus")),
    ("parse-unknown-engine", _monitor("--out", "{tmp}/run", "--parse", "nonsense", names="nonsense")),
    ("warmup-negative", _monitor("--out", "{tmp}/run", "--warmup-steps", "-1", names="--warmup-steps")),
    ("unknown-root-option", lambda tmp: Hostile(["--bogus-option", "monitor", "--", "true"], "--bogus-option")),
    ("out-is-a-file", _monitor_out_is_file),
    ("out-is-a-measured-run", _monitor_out_is_run),
    ("out-under-a-file", _monitor_out_in_file),
]

# --- damaged run directories ----------------------------------------------------------------------


def _good_run(tmp: Path) -> Path:
    return write_run(tmp / "run", hosts=1, devices_per_host=2, steps=3)


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _events_file(run: Path) -> Path:
    return run / "events" / "rank-0.parquet"


def _telemetry_file(run: Path) -> Path:
    return next((run / "telemetry").glob("*.parquet"))


def _rename_columns(path: Path, renames: dict[str, str]) -> None:
    t = pq.read_table(path)
    pq.write_table(t.rename_columns([renames.get(c, c) for c in t.column_names]), path)


def _retype_events(path: Path) -> None:
    t = pq.read_table(path)
    i = t.column_names.index("t_start_ns")
    pq.write_table(t.set_column(i, "t_start_ns", pa.array([f"at {v}" for v in t["t_start_ns"].to_pylist()])), path)


def _run_json_edit(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        info = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps(edit(info)))
    return damage


def _set(key: str, value: object) -> Callable[[dict], dict]:
    def edit(info: dict) -> dict:
        info[key] = value
        return info
    return edit


def _replace_with_dir(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _dangling(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.parent / "does-not-exist")


# (id, damage(run dir), file the line names)
DAMAGES: list[tuple[str, Callable[[Path], None], str]] = [
    ("run-json-garbage", lambda r: (r / "run.json").write_text("{not json at all"), "run.json"),
    ("run-json-empty", lambda r: (r / "run.json").write_text(""), "run.json"),
    ("run-json-list", lambda r: (r / "run.json").write_text("[1, 2, 3]"), "run.json"),
    ("run-json-non-utf8", lambda r: (r / "run.json").write_bytes(b'{"status": "\xff\xfe"}'), "run.json"),
    ("run-json-directory", lambda r: _replace_with_dir(r / "run.json"), "run.json"),
    ("run-json-dangling-link", lambda r: _dangling(r / "run.json"), "run.json"),
    ("run-json-missing", lambda r: (r / "run.json").unlink(), "run.json"),
    ("run-json-devices-string", _run_json_edit(_set("devices", "gpu0")), "devices"),
    ("run-json-rank-map-string", _run_json_edit(_set("rank_map", "rank0")), "rank_map"),
    ("run-json-start-text", _run_json_edit(_set("start_ns", "yesterday")), "start_ns"),
    ("run-json-warmup-negative", _run_json_edit(_set("warmup_steps", -3)), "warmup_steps"),
    ("telemetry-truncated", lambda r: _truncate(_telemetry_file(r)), "telemetry"),
    ("telemetry-garbage", lambda r: _telemetry_file(r).write_bytes(b"PAR1" + os.urandom(64)), "telemetry"),
    ("telemetry-empty-file", lambda r: _telemetry_file(r).write_bytes(b""), "telemetry"),
    ("telemetry-wrong-schema", lambda r: _rename_columns(_telemetry_file(r), {"t_ns": "time", "power_w": "watts"}),
     "telemetry"),
    ("telemetry-directory", lambda r: _replace_with_dir(_telemetry_file(r)), "telemetry"),
    ("events-truncated", lambda r: _truncate(_events_file(r)), "rank-0.parquet"),
    ("events-garbage", lambda r: _events_file(r).write_bytes(os.urandom(200)), "rank-0.parquet"),
    ("events-wrong-schema", lambda r: _rename_columns(_events_file(r), {"t_end_ns": "end"}), "rank-0.parquet"),
    ("events-wrong-type", lambda r: _retype_events(_events_file(r)), "rank-0.parquet"),
]


def _rundir_case(damage: Callable[[Path], None], names: str, command: str) -> Callable[[Path], Hostile]:
    def make(tmp: Path) -> Hostile:
        run = _good_run(tmp)
        damage(run)
        argv = {"summarize": ["summarize", str(run)],
                "report": ["report", str(run), "--out", str(tmp / "report-out"), "--formats", ""],
                "trace": ["trace", str(run), "--out", str(tmp / "trace.json")],
                "compare": ["compare", str(run), str(write_run(tmp / "other", hosts=1, devices_per_host=2, steps=3))],
                }[command]
        return Hostile(argv, names)
    return make


def _missing_run(command: str) -> Callable[[Path], Hostile]:
    def make(tmp: Path) -> Hostile:
        argv = {"summarize": ["summarize"], "report": ["report"], "trace": ["trace"]}[command]
        return Hostile([*argv, str(tmp / "no-such-run")], "no-such-run")
    return make


def _file_as_run(command: str) -> Callable[[Path], Hostile]:
    def make(tmp: Path) -> Hostile:
        (tmp / "notes.txt").write_text("not a run\n")
        argv = {"summarize": ["summarize"], "report": ["report"], "trace": ["trace"]}[command]
        return Hostile([*argv, str(tmp / "notes.txt")], "notes.txt")
    return make


# --- importers ------------------------------------------------------------------------------------

NVSMI_HEAD = "timestamp, index, power.draw [W], temperature.gpu\n"


def _nvsmi_rows(n: int = 20, power: str = "300.0 W", temp: str = "60") -> str:
    return "".join(f"2024/05/01 10:00:{s // 10:02d}.{(s % 10) * 100:03d}, 0, {power}, {temp}\n" for s in range(n))


def _import_file(kind: str, name: str, content: str | bytes, names: str, invalid: bool = True,
                 extra: tuple[str, ...] = ()) -> Callable[[Path], Hostile]:
    def make(tmp: Path) -> Hostile:
        src = tmp / name
        if isinstance(content, bytes):
            src.write_bytes(content)
        else:
            src.write_text(content)
        # --tz only where the kind reads it: elsewhere it is refused before the source is read
        tz = ("--tz", "UTC") if kind not in ("study_csv", "kineto", "mlperf") else ()
        return Hostile(["import", kind, str(src), "--out", str(tmp / "imported"), *tz, *extra],
                       names, invalid=invalid)
    return make


def _gz(text: str) -> bytes:
    return gzip.compress(text.encode())


def _import_into_run(tmp: Path) -> Hostile:
    write_run(tmp / "measured", hosts=1, devices_per_host=1, steps=2)
    (tmp / "gpu.csv").write_text(NVSMI_HEAD + _nvsmi_rows())
    return Hostile(["import", "nvsmi", str(tmp / "gpu.csv"), "--out", str(tmp / "measured"), "--tz", "UTC"],
                   "measured")


def _import_missing(tmp: Path) -> Hostile:
    return Hostile(["import", "nvsmi", str(tmp / "nope.csv"), "--out", str(tmp / "imported")], "nope.csv")


def _import_directory(tmp: Path) -> Hostile:
    (tmp / "adir").mkdir()
    return Hostile(["import", "nvsmi", str(tmp / "adir"), "--out", str(tmp / "imported"), "--tz", "UTC"], "adir")


IMPORTS: list[tuple[str, Callable[[Path], Hostile]]] = [
    ("unknown-kind", _import_file("bogus", "gpu.csv", NVSMI_HEAD + _nvsmi_rows(), "bogus")),
    ("nvsmi-given-json", _import_file("nvsmi", "gpu.json", '{"a": 1}\n', "gpu.json")),
    ("nvsmi-binary", _import_file("nvsmi", "gpu.csv", os.urandom(300), "gpu.csv")),
    ("nvsmi-empty", _import_file("nvsmi", "gpu.csv", "", "gpu.csv")),
    ("nvsmi-header-only", _import_file("nvsmi", "gpu.csv", NVSMI_HEAD, "gpu.csv")),
    ("nvsmi-truncated-row", _import_file("nvsmi", "gpu.csv", NVSMI_HEAD + _nvsmi_rows() + "2024/05/01 10:00:0",
                                         "gpu.csv")),
    ("nvsmi-unknown-unit", _import_file("nvsmi", "gpu.csv", "timestamp, index, power.draw [furlong], temperature.gpu\n"
                                        + _nvsmi_rows(power="300.0 furlong"), "power.draw")),
    ("nvsmi-not-gzip", _import_file("nvsmi", "gpu.csv.gz", NVSMI_HEAD + _nvsmi_rows(), "gpu.csv.gz")),
    ("nvsmi-truncated-gzip", _import_file("nvsmi", "gpu.csv.gz", _gz(NVSMI_HEAD + _nvsmi_rows(200))[:120],
                                          "gpu.csv.gz")),
    ("nvsmi-power-1e308", _import_file("nvsmi", "gpu.csv", NVSMI_HEAD + _nvsmi_rows(power="1e308 W"), "power",
                                       invalid=False)),
    ("nvsmi-power-inf", _import_file("nvsmi", "gpu.csv", NVSMI_HEAD + _nvsmi_rows(power="inf W"), "power",
                                     invalid=False)),
    ("nvsmi-power-negative", _import_file("nvsmi", "gpu.csv", NVSMI_HEAD + _nvsmi_rows(power="-500 W"), "power",
                                          invalid=False)),
    ("nvsmi-temp-absolute-zero", _import_file("nvsmi", "gpu.csv", NVSMI_HEAD + _nvsmi_rows(temp="-273"), "temp",
                                              invalid=False)),
    ("nvsmi-bad-time", _import_file("nvsmi", "gpu.csv", NVSMI_HEAD + "yesterday, 0, 300 W, 60\n", "gpu.csv")),
    ("nvsmi-bad-tz", _import_file("nvsmi", "gpu.csv", NVSMI_HEAD + _nvsmi_rows(), "Mars/Phobos",
                                  extra=("--tz", "Mars/Phobos"))),
    ("nvsmi-bad-anchor", _import_file("nvsmi", "gpu.csv", NVSMI_HEAD + _nvsmi_rows(), "--anchor",
                                      extra=("--anchor", "not-a-time"))),
    ("nvsmi-bad-window", _import_file("nvsmi", "gpu.csv", NVSMI_HEAD + _nvsmi_rows(), "--window",
                                      extra=("--window", "soon,later"))),
    ("nvsmi-missing-source", _import_missing),
    ("nvsmi-directory-source", _import_directory),
    ("out-is-a-measured-run", _import_into_run),
    ("powertraces-empty", _import_file("powertraces", "trace.csv", "", "trace.csv")),
    ("powertraces-garbage", _import_file("powertraces", "trace.csv", "a;b;c\n1;2\n", "trace.csv")),
    ("study-csv-empty", _import_file("study_csv", "power_0.csv", "", "power_0.csv")),
    ("study-csv-garbage", _import_file("study_csv", "power_0.csv", "\x00\x01\x02garbage\n", "power_0.csv")),
    ("framework-log-empty", _import_file("framework_log", "train.log", "", "train.log")),
    ("framework-log-no-steps", _import_file("framework_log", "train.log", "hello\nworld\n", "train.log")),
    ("kineto-empty", _import_file("kineto", "trace.json", "", "trace.json")),
    ("kineto-truncated-json", _import_file("kineto", "trace.json", '{"traceEvents": [{"ph": "X", "ts": 1',
                                           "trace.json")),
    ("kineto-wrong-shape", _import_file("kineto", "trace.json", '[1, 2, 3]', "trace.json")),
    ("mlperf-empty", _import_file("mlperf", "result_0.txt", "", "result_0.txt")),
    ("mlperf-garbage", _import_file("mlperf", "result_0.txt", ":::MLLOG {not json\n", "result_0.txt")),
    ("zeus-empty", _import_file("zeus", "power.csv", "", "power.csv")),
    ("zeus-garbage", _import_file("zeus", "power.csv", "x,y\n1\n", "power.csv")),
    ("auto-garbage", _import_file("auto", "mystery.bin", os.urandom(256), "mystery.bin")),
]

# --- damaged content that still reads ---------------------------------------------------------------
# The figure a command prints from such content is only honest with its note; a refusal is fine too.


def _telemetry_edit(edit: Callable[[pa.Table], pa.Table]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        path = _telemetry_file(run)
        pq.write_table(edit(pq.read_table(path)), path)
    return damage


def _clock_step_back(seconds: float) -> Callable[[pa.Table], pa.Table]:
    """The host's clock steps back ``seconds`` half-way through and runs on from there."""
    def edit(t: pa.Table) -> pa.Table:
        ts = t["t_ns"].to_numpy().copy()
        mid = ts.min() + (ts.max() - ts.min()) // 2
        ts[ts > mid] -= int(seconds * 1e9)
        return t.set_column(t.column_names.index("t_ns"), "t_ns", pa.array(ts, pa.int64()))
    return edit




def _negative_tokens(run: Path) -> None:
    path = _events_file(run)
    t = pq.read_table(path)
    tok = t["tokens"].to_pylist()
    i = next(i for i, v in enumerate(tok) if v)
    tok[i] = -abs(tok[i])
    pq.write_table(t.set_column(t.column_names.index("tokens"), t.schema.field("tokens"),
                                pa.array(tok, t.schema.field("tokens").type)), path)


def _content_run(damage: Callable[[Path], None], note: str | tuple[str, ...], *, long: bool = False
                 ) -> Callable[[Path], Hostile]:
    def make(tmp: Path) -> Hostile:
        run = (write_run(tmp / "run", hosts=1, devices_per_host=2, steps=5, step_s=20.0) if long
               else _good_run(tmp))
        damage(run)
        return Hostile(["summarize", str(run)], "run", invalid=False, note=note, note_in="run/summary.json")
    return make


def _nvsmi_with(rows: str, note: str | tuple[str, ...]) -> Callable[[Path], Hostile]:
    def make(tmp: Path) -> Hostile:
        (tmp / "gpu.csv").write_text(NVSMI_HEAD + rows)
        return Hostile(["import", "nvsmi", str(tmp / "gpu.csv"), "--out", str(tmp / "imported"), "--tz", "UTC"],
                       "gpu.csv", invalid=False, note=note, note_in="imported/run.json")
    return make


def _nvsmi_at(seconds: list[float], power: str = "300.0 W") -> str:
    def stamp(x: float) -> str:
        h, rest = divmod(x, 3600)
        m, sec = divmod(rest, 60)
        return f"2024/05/01 {10 + int(h):02d}:{int(m):02d}:{sec:06.3f}"
    return "".join(f"{stamp(x)}, 0, {power}, 60\n" for x in seconds)


def _fifo(tmp: Path, name: str) -> Path:
    path = tmp / name
    os.mkfifo(path)
    return path


def _fifo_spec(command: list[str]) -> Callable[[Path], Hostile]:
    def make(tmp: Path) -> Hostile:
        spec = _fifo(tmp, "spec.yaml")
        argv = ["run", str(spec), "--check"] if command == ["run"] else [*command, str(spec)]
        return Hostile(argv, "spec.yaml")
    return make


def _fifo_in_run(which: str, command: str) -> Callable[[Path], Hostile]:
    def make(tmp: Path) -> Hostile:
        run = _good_run(tmp)
        target = _telemetry_file(run) if which == "telemetry" else _events_file(run)
        target.unlink()
        os.mkfifo(target)
        argv = ["trace", str(run), "--out", str(tmp / "trace.json")] if command == "trace" else [command, str(run)]
        return Hostile(argv, target.name)
    return make


def _host_as_path(tmp: Path) -> Hostile:
    (tmp / "a" / "b").mkdir(parents=True)
    (tmp / "gpu.csv").write_text(NVSMI_HEAD + _nvsmi_rows())
    return Hostile(["import", "nvsmi", str(tmp / "gpu.csv"), "--out", str(tmp / "a" / "b" / "imported"),
                    "--tz", "UTC", "--host", "../../x"], "--host", writes_under=())


def _spec_name(name: str) -> Callable[[Path], Hostile]:
    def make(tmp: Path) -> Hostile:
        spec = tmp / "spec.yaml"
        spec.write_text(_replace(GOOD_RUN, "name: tiny", f"name: {json.dumps(name.replace('{tmp}', str(tmp)))}"))
        return Hostile(["run", str(spec), "--check"], ("name", "spec.yaml"), writes_under=())
    return make


def _escapes_in_names(tmp: Path) -> Hostile:
    run = _good_run(tmp)
    info = json.loads((run / "run.json").read_text())
    info["name"] = "run\x1b]0;owned\x07\x1b[2J\u202etxt.exe"
    (run / "run.json").write_text(json.dumps(info))
    return Hostile(["summarize", str(run)], "run", invalid=False, note="\\x1b",
                   absent=("\x1b", "\u202e", "\x07"))


def _out_is_a_sweep(tmp: Path) -> Hostile:
    sweep = tmp / "sweep"
    write_run(sweep / "point-0", hosts=1, devices_per_host=1, steps=2)
    (sweep / "sweep.json").write_text(json.dumps({"name": "sweep", "runs": []}))
    return Hostile(["monitor", "-q", "--out", str(sweep), "--", "true"], "sweep", writes_under=())


CONTENT: list[tuple[str, Callable[[Path], Hostile]]] = [
    ("rundir/telemetry-clock-steps-back-3s",
     _content_run(_telemetry_edit(_clock_step_back(3.0)), ("the clock went backwards", "energy over a window"))),
    ("rundir/telemetry-hole-80s",
     _content_run(_telemetry_edit(damaged.hole(20.0, 80.0)), "gaps longer than energy bridges", long=True)),
    ("rundir/power-nan", _content_run(_telemetry_edit(damaged.power_every(float("nan"))), ("implausible", "non-finite"))),
    ("rundir/power-negative", _content_run(_telemetry_edit(damaged.power_every(-400.0)), ("implausible", "negative"))),
    ("rundir/tokens-negative", _content_run(_negative_tokens, "carry a count below zero")),
    ("rundir/rank-events-missing",
     _content_run(lambda r: (r / "events" / "rank-1.parquet").unlink(), ("events/rank-1.parquet", "tokens_per_s"))),
    ("import/nvsmi-clock-steps-back-30s",
     _nvsmi_with(_nvsmi_at([i * 1.0 for i in range(60)] + [30.0 + i for i in range(60)]),
                 ("the clock goes backwards", "gpu.csv:62"))),
    ("import/nvsmi-hole-1h", _nvsmi_with(_nvsmi_at([i * 1.0 for i in range(30)] + [3630.0 + i for i in range(30)]),
                                         ("gap(s) in the readings longer than", "3601.0 s"))),
    ("names/import-host-is-a-path", _host_as_path),
    ("names/spec-name-absolute", _spec_name("{tmp}/elsewhere/x")),
    ("names/spec-name-nested", _spec_name("sub/dir")),
    ("names/terminal-escapes-in-a-run-name", _escapes_in_names),
    ("files/spec-is-a-fifo/plan", _fifo_spec(["plan"])),
    ("files/spec-is-a-fifo/run-check", _fifo_spec(["run"])),
    ("files/telemetry-is-a-fifo/summarize", _fifo_in_run("telemetry", "summarize")),
    ("files/events-is-a-fifo/trace", _fifo_in_run("events", "trace")),
    ("monitor/out-is-a-sweep", _out_is_a_sweep),
]
# a FIFO blocks the reader that opens it: bounded subprocesses, so a regression fails instead of hanging
HANG_HOSTILE = frozenset(name for name, _ in CONTENT if "fifo" in name)

# --- the table ------------------------------------------------------------------------------------

# sizes that, unbounded, allocate per device or per point: run as bounded subprocesses
RESOURCE_HOSTILE = frozenset({"huge-int", "huge-devices"})
SPEC_COMMANDS = {"plan": ["plan"], "run-check": ["run"], "predict": ["predict"]}
RUNDIR_COMMANDS = ("summarize", "report", "trace", "compare")
NOT_READ_BY_TRACE = frozenset({"run-json-warmup-negative"})  # a trace has no warm-up rule: nothing is wrong


def _build_cases() -> list[Case]:
    cases: list[Case] = []
    for name, content, names in SPEC_CONTENTS:
        for cmd, argv in SPEC_COMMANDS.items():
            cases.append(Case(f"spec/{cmd}/{name}", "spec", _spec_case(name, content, names, argv),
                              subprocess=name in RESOURCE_HOSTILE,
                              fixed_by="spec bounds" if name in ("over-1MiB", "unknown-device", "huge-int",
                                                                 "huge-devices") else ""))
    for name, content, names in SWEEP_CONTENTS:
        cases.append(Case(f"spec/plan/{name}", "spec", _spec_case(name, content, names, ["plan"]),
                          fixed_by="Slurm values" if "grid" not in name else ""))
    for name, make in MONITOR:
        cases.append(Case(f"monitor/{name}", "monitor", make))
    for name, damage, names in DAMAGES:
        for cmd in RUNDIR_COMMANDS:
            if cmd == "trace" and name in NOT_READ_BY_TRACE:
                continue
            cases.append(Case(f"rundir/{cmd}/{name}", "rundir", _rundir_case(damage, names, cmd),
                              fixed_by="damaged run directories"))
    for cmd in ("summarize", "report", "trace"):
        cases.append(Case(f"rundir/{cmd}/missing-folder", "rundir", _missing_run(cmd)))
        cases.append(Case(f"rundir/{cmd}/file-not-folder", "rundir", _file_as_run(cmd)))
    for name, make in IMPORTS:
        cases.append(Case(f"import/{name}", "import", make, fixed_by="import messages"))
    for name, make in CONTENT:
        cases.append(Case(f"content/{name}", "content", make, subprocess=name in HANG_HOSTILE,
                          fixed_by="issue 29"))
    # a few through the real console script: the one error path of main(), not only of the app
    cases.append(Case("spec/plan/non-utf8/console-script", "spec",
                      _spec_case("non-utf8", b"name: \xff\n", "{spec}", ["plan"]), subprocess=True))
    cases.append(Case("spec/plan/directory/console-script", "spec",
                      _spec_case("directory", None, "{spec}", ["plan"]), subprocess=True))
    cases.append(Case("monitor/rate-text/console-script", "monitor",
                      _monitor("--out", "{tmp}/run", "--rate", "abc", names="--rate"), subprocess=True))
    cases.append(Case("monitor/port-in-use/console-script", "monitor", _monitor_port_in_use, subprocess=True))
    cases.append(Case("rundir/summarize/run-json-garbage/console-script", "rundir",
                      _rundir_case(DAMAGES[0][1], "run.json", "summarize"), subprocess=True))
    return cases


CASES = _build_cases()

# --------------------------------------------------------------------------------------------- running


def snapshot(root: Path) -> dict[str, str]:
    """sha256 of every regular file under ``root`` (links not followed), by relative path."""
    out: dict[str, str] = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            if p.is_file() and not p.is_symlink():
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@dataclass
class Outcome:
    case: str
    exit_code: int
    stderr: str
    stdout: str
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


MEMORY_LIMIT = 4 << 30  # address space of a subprocess case: a hostile size must not take the machine
TIME_LIMIT_S = 120


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _invoke(argv: list[str], env: dict[str, str], use_subprocess: bool, cwd: Path) -> tuple[int, str, str]:
    if use_subprocess:
        exe = Path(sys.executable).with_name("powertrain")
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "powertrain.cli"]
        try:
            res = subprocess.run([*cmd, *argv], capture_output=True, text=True, timeout=TIME_LIMIT_S, cwd=cwd,
                                 env={**os.environ, **env, "COLUMNS": "200"}, stdin=subprocess.DEVNULL,
                                 preexec_fn=_limit_memory)
        except subprocess.TimeoutExpired as exc:
            return -9, str(exc.stdout or ""), f"(no answer within {TIME_LIMIT_S} s)\n{exc.stderr or ''}"
        return res.returncode, res.stdout, res.stderr
    old = Path.cwd()
    os.chdir(cwd)
    try:
        res = CliRunner().invoke(app, argv, env={**env, "COLUMNS": "200"})
    finally:
        os.chdir(old)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import traceback

        tb = "".join(traceback.format_exception(res.exception))
        return res.exit_code, res.stdout, res.stderr + "\nTraceback (escaped the CLI):\n" + tb
    return res.exit_code, res.stdout, res.stderr


def run_case(case: Case, tmp: Path) -> Outcome:
    """Build the input in ``tmp``, run it, and list every broken promise (none: the case passes)."""
    tmp.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if case.make in (_monitor_port_in_use,):
            port = stack.enter_context(_port_in_use())
            (tmp / ".port").write_text(str(port))
        h = case.make(tmp)
        before = snapshot(tmp)
        code, out, err = _invoke(h.argv, h.env, case.subprocess, tmp)
        after = snapshot(tmp)
    problems: list[str] = []
    if code == -9:
        problems.append(PROBLEM_HANG)
    if h.invalid and code == 0:
        problems.append("exit code 0 for an invalid input")
    if "Traceback" in err or "Traceback" in out:
        problems.append("a traceback")
    problems += _message_problems(h, out, err, tmp)
    changed = [p for p, digest in before.items() if after.get(p) != digest]
    if changed:
        problems.append(f"pre-existing files changed or removed: {', '.join(sorted(changed)[:5])}")
    if h.writes_under is not None:
        new = [p for p in after if p not in before and not any(p.startswith(w) for w in h.writes_under)]
        if new:
            problems.append(f"written outside its target: {', '.join(sorted(new)[:5])}")
    if (tmp / "pwned").exists():
        problems.append("an injected command ran")
    return Outcome(case.id, code, err, out, problems)


PROBLEM_HANG = "no answer (hang)"


def _message_problems(h: Hostile, out: str, err: str, tmp: Path) -> list[str]:
    """What the command said: one line naming the input (a refusal), or the note (content that reads)."""
    names = (h.names,) if isinstance(h.names, str) else h.names
    if h.note:
        said = " ".join((out + err).split())
        if h.note_in:
            target = tmp / h.note_in
            said += " " + (" ".join(target.read_text(errors="replace").split()) if target.is_file() else "")
        notes = (h.note,) if isinstance(h.note, str) else h.note
        missing = [n for n in notes if n not in said]
        problems = [f"no note {n!r} (silent)" for n in missing]
    else:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if len(lines) != 1:
            problems = [f"{len(lines)} lines on stderr, not one"]
        elif not any(n in lines[0] for n in names):
            problems = [f"the error line does not name {' or '.join(map(repr, names))}"]
        else:
            problems = []
    problems += [f"{a!r} reached the output raw" for a in h.absent if a in out or a in err]
    return problems


def kind_of_problem(problem: str) -> str:
    """The benchmark's columns: silent-wrong (no refusal or note), hang, data lost (a file changed or
    written outside its target), code ran, message (the line itself)."""
    if problem == PROBLEM_HANG:
        return "hang"
    if problem.startswith(("pre-existing files", "written outside")):
        return "data lost"
    if problem.startswith("an injected command"):
        return "code ran"
    if problem.startswith(("exit code 0", "no note")) or "reached the output raw" in problem:
        return "silent-wrong"
    return "message"


# --------------------------------------------------------------------------------------------- tests


@pytest.fixture(autouse=True)
def _restore_powertrain_logger() -> Iterator[None]:
    logger = logging.getLogger(LOGGER)
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


def test_the_table_is_large_and_covers_every_area() -> None:
    areas = {c.area for c in CASES}
    assert areas == {"spec", "monitor", "rundir", "import", "content"}
    assert len(CASES) >= 100
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_one_line_and_harms_nothing(case: Case, tmp_path: Path) -> None:
    outcome = run_case(case, tmp_path / "work")
    assert outcome.ok, (f"{case.id}: {'; '.join(outcome.problems)} (exit {outcome.exit_code})\n"
                        f"stderr:\n{outcome.stderr[-3000:]}\nstdout:\n{outcome.stdout[-1500:]}")


# --- the one error path itself ---------------------------------------------------------------------


_BROKEN_CLI = ("import sys, powertrain.cli.summarize as s\n"
               "def boom(path): raise RuntimeError('broken on purpose')\n"
               "s.is_sweep_dir = boom\n"
               "from powertrain.cli import main\n"
               "main()\n")


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    """The console script with a command that breaks: one line, or with --debug / POWERTRAIN_DEBUG=1 the
    traceback."""
    env = {k: v for k, v in os.environ.items() if k != "POWERTRAIN_DEBUG"}
    for argv, extra in ((["--debug", "summarize", "."], {}), (["summarize", "."], {"POWERTRAIN_DEBUG": "1"})):
        res = subprocess.run([sys.executable, "-c", _BROKEN_CLI, *argv], capture_output=True, text=True,
                             timeout=120, env={**env, **extra}, cwd=tmp_path)
        assert res.returncode != 0
        assert "Traceback (most recent call last)" in res.stderr and "broken on purpose" in res.stderr, res.stderr
    plain = subprocess.run([sys.executable, "-c", _BROKEN_CLI, "summarize", "."], capture_output=True, text=True,
                           timeout=120, env=env, cwd=tmp_path)
    assert plain.returncode == 2
    assert plain.stderr.splitlines() == ["powertrain: error: RuntimeError: broken on purpose "
                                         "(unexpected; --debug shows the traceback)"], plain.stderr


def test_an_unexpected_exception_is_one_line_naming_its_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    from powertrain.cli import root

    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("something\ninside broke")

    monkeypatch.setattr("powertrain.cli.summarize.is_sweep_dir", boom)
    res = CliRunner().invoke(app, ["summarize", "."])
    assert res.exit_code == 2
    assert res.stderr.splitlines() == [root.PREFIX + "RuntimeError: something; inside broke "
                                       "(unexpected; --debug shows the traceback)"]
    res = CliRunner().invoke(app, ["--debug", "summarize", "."])
    assert isinstance(res.exception, RuntimeError)  # re-raised, traceback and all
    res = CliRunner().invoke(app, ["summarize", "."], env={"POWERTRAIN_DEBUG": "1"})
    assert isinstance(res.exception, RuntimeError)
    res = CliRunner().invoke(app, ["summarize", "."], env={"POWERTRAIN_DEBUG": "0"})
    assert res.exit_code == 2 and res.exception is not None and isinstance(res.exception, SystemExit)


def test_error_lines_of_known_kinds() -> None:
    import yaml
    from pydantic import BaseModel, ValidationError

    from powertrain.cli.root import error_line

    class M(BaseModel):
        a: int

    class Outer(BaseModel):
        m: M
        b: int

    with pytest.raises(ValidationError) as v:
        Outer.model_validate({"m": {"a": "x"}, "b": "y"})
    assert error_line(v.value) == "Outer: m.a: Input should be a valid integer, unable to parse string as an " \
                                  "integer (and 1 more problem(s))"
    with pytest.raises(yaml.YAMLError) as y:
        yaml.safe_load("a: [1,\nb: 2\n")
    assert "not valid YAML" in error_line(y.value) and ":" in error_line(y.value)
    assert error_line(IsADirectoryError(21, "Is a directory", "/x/spec.yaml")) == "/x/spec.yaml: Is a directory"
    assert error_line(PermissionError(13, "Permission denied", "/x/run.json")) == "/x/run.json: Permission denied"
    assert error_line(UnicodeDecodeError("utf-8", b"ab\xff", 2, 3, "invalid start byte")) == \
        "not UTF-8 text: byte 0xff at position 2 (invalid start byte)"
    assert error_line(ValueError("a\nb\x00c")) == "a; b\\x00c"
    assert len(error_line(ValueError("x" * 10_000))) <= 600


# --- step events: impossible durations are dropped and counted --------------------------------------


def _write_events(run: Path, durations_s: list[float | None]) -> None:
    rows = events_table(0, warmup=0, steps=len(durations_s)).to_pylist()
    steps = [r for r in rows if r["kind"] == "step"]
    for r, d in zip(steps, durations_s, strict=True):
        if d is None:
            r["t_end_ns"] = r["t_start_ns"]  # schema: not nullable; zero instead
        else:
            r["t_end_ns"] = r["t_start_ns"] + int(d * 1e9)
    pq.write_table(pa.Table.from_pylist(steps, schema=EVENTS_SCHEMA), _events_file(run))


def test_impossible_step_durations_are_dropped_counted_and_noted(tmp_path: Path) -> None:
    from powertrain.analyze import load_summary

    run = write_run(tmp_path / "run", hosts=1, devices_per_host=1, warmup=0, steps=6)
    _write_events(run, [1.0, 1.0, -5.0, None, 4e8, 1.0])
    summ = load_summary(run, refresh=True)
    dq = summ["data_quality"]["dropped_steps"]
    assert dq["count"] == 3
    assert dq["reasons"] == {"negative duration": 1, "zero duration": 1, "longer than 7 days": 1}
    assert summ["metrics"]["step_time_mean_s"] == pytest.approx(1.0)
    assert any("3 step event(s) dropped" in n for n in summ["notes"]), summ["notes"]


def test_all_steps_impossible_gives_null_with_the_reason(tmp_path: Path) -> None:
    from powertrain.analyze import load_summary

    run = write_run(tmp_path / "run", hosts=1, devices_per_host=1, warmup=0, steps=2)
    _write_events(run, [-1.0, -2.0])
    summ = load_summary(run, refresh=True)
    assert summ["metrics"]["step_time_mean_s"] is None
    assert "2 impossible step event(s) were dropped" in summ["why_null"]["step_time_mean_s"]
    assert summ["data_quality"]["dropped_steps"]["count"] == 2


def test_screen_steps_keeps_other_kinds_and_survives_extreme_stamps() -> None:
    from powertrain.analyze.steps import screen_steps

    big = 2**62
    rows = [{"rank": 0, "kind": "step", "step": 0, "t_start_ns": -big, "t_end_ns": big},  # int64 difference overflows
            {"rank": 0, "kind": "step", "step": 1, "t_start_ns": T0_NS, "t_end_ns": T0_NS + 1},  # 1 ns: kept
            {"rank": 0, "kind": "forward", "step": 1, "t_start_ns": T0_NS + 5, "t_end_ns": T0_NS}]  # not a step
    kept, dropped = screen_steps(pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA))
    assert kept["step"].to_pylist() == [1, 1]
    assert dropped["count"] == 1 and dropped["reasons"] == {"longer than 7 days": 1}
    assert dropped["first"].startswith("rank 0 step 0:")
