"""Audit 2 (M3, M6, L6, L8, L9, L10): the trainer callbacks say which of their settings a supervising
command overrides, ``$POWERTRAIN_RUN_DIR`` must name a running run, a public Prometheus address from
Python is refused with the Python fix, ranks are whole numbers >= 0, the "mark both or neither"
window rule is documented, and a malformed ``$POWERTRAIN_FAULT`` is refused."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import powertrain
from powertrain import hooks
from powertrain.hooks import markers
from powertrain.integrations import RankAttachment
from powertrain.live.prometheus import PUBLIC_ENV
from powertrain.monitor import Monitor, run_command
from powertrain.store import read_events

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.fixture(autouse=True)
def _own_recorder(monkeypatch):
    """Each test starts with no process-wide recorder and a clean marker environment."""
    monkeypatch.setattr(markers, "_recorder", None)
    for var in (hooks.FLUSH_ENV, "RANK", hooks.RUN_DIR_ENV, PUBLIC_ENV):
        monkeypatch.delenv(var, raising=False)
    yield
    markers.close()


def _run_dir(path: Path, status: str | None = "running") -> Path:
    """A run folder as ``powertrain monitor`` leaves it for its command (``status: running``), or
    one that has ended; ``status=None``: a folder with no ``run.json``."""
    path.mkdir(parents=True)
    if status is not None:
        (path / "run.json").write_text(json.dumps({"schema": "powertrain.run/1", "status": status}))
    return path


def _attach_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "powertrain.integrations.attach" and r.levelno == logging.WARNING]


# -- M3: settings a supervising command overrides are named, once -----------------------------------
def test_attachment_under_a_run_names_every_ignored_setting_in_one_warning(tmp_path, monkeypatch, caplog):
    run = _run_dir(tmp_path / "mon")
    monkeypatch.setenv(hooks.RUN_DIR_ENV, str(run))
    att = RankAttachment(tmp_path / "mine", rate_hz=100, backends=["bogus"], name="my-label",
                         prometheus="0.0.0.0:1")
    with caplog.at_level(logging.WARNING, logger="powertrain.integrations.attach"):
        assert att.start(rank=0, local_rank=0, world_size=1) == run
        att.begin_step(0, tokens=4)
        att.end_step()
        att.stop("ok")
    msgs = _attach_warnings(caplog)
    assert len(msgs) == 1, msgs
    msg = msgs[0]
    assert "\n" not in msg
    assert "out, rate_hz, backends, name, prometheus of RankAttachment are ignored" in msg
    assert str(run) in msg and "powertrain monitor" in msg and "--rate" in msg and "--backends" in msg
    assert att.monitor is None and not (tmp_path / "mine").exists()
    assert [e["step"] for e in read_events(run).to_pylist()] == [0]


def test_attachment_names_only_the_settings_that_differ_from_their_defaults(tmp_path, monkeypatch, caplog):
    run = _run_dir(tmp_path / "mon")
    monkeypatch.setenv(hooks.RUN_DIR_ENV, str(run))
    att = RankAttachment(rate_hz=20.0, backends="auto", name="label")  # 20 and "auto" are the defaults
    with caplog.at_level(logging.WARNING, logger="powertrain.integrations.attach"):
        att.start(rank=0, local_rank=0, world_size=1)
        att.stop("ok")
    msgs = _attach_warnings(caplog)
    assert len(msgs) == 1 and ": name of RankAttachment is ignored" in msgs[0], msgs
    assert "--out (a run is named after its folder)" in msgs[0]


def test_attachment_with_default_settings_under_a_run_says_nothing(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(hooks.RUN_DIR_ENV, str(_run_dir(tmp_path / "mon")))
    att = RankAttachment(warmup_steps=3)  # warmup_steps is the attachment's own: it is applied, not ignored
    with caplog.at_level(logging.WARNING, logger="powertrain.integrations.attach"):
        att.start(rank=0, local_rank=0, world_size=1)
        att.stop("ok")
    assert _attach_warnings(caplog) == []


def test_hf_callback_under_a_run_warns_in_its_own_name(tmp_path, monkeypatch, caplog):
    pytest.importorskip("transformers")
    from powertrain.integrations.hf import PowertrainCallback

    monkeypatch.setenv(hooks.RUN_DIR_ENV, str(_run_dir(tmp_path / "mon")))
    cb = PowertrainCallback(tmp_path / "mine", rate_hz=5, prometheus=":9400")
    args = SimpleNamespace(process_index=0, local_process_index=0, world_size=1)
    with caplog.at_level(logging.WARNING, logger="powertrain.integrations.attach"):
        cb.on_train_begin(args, None, None)
        cb.attachment.stop("ok")
    msgs = _attach_warnings(caplog)
    assert len(msgs) == 1 and "out, rate_hz, prometheus of PowertrainCallback are ignored" in msgs[0], msgs


def test_lightning_callback_under_a_run_warns_in_its_own_name(tmp_path, monkeypatch, caplog):
    pytest.importorskip("lightning")
    from powertrain.integrations.lightning import PowertrainCallback

    monkeypatch.setenv(hooks.RUN_DIR_ENV, str(_run_dir(tmp_path / "mon")))
    cb = PowertrainCallback(backends="host")
    trainer = SimpleNamespace(global_rank=0, local_rank=0, world_size=1,
                              strategy=SimpleNamespace(barrier=None, broadcast=None))
    with caplog.at_level(logging.WARNING, logger="powertrain.integrations.attach"):
        cb.on_fit_start(trainer, None)
        cb.attachment.stop("ok")
    msgs = _attach_warnings(caplog)
    assert len(msgs) == 1 and ": backends of PowertrainCallback is ignored" in msgs[0], msgs


@pytest.mark.parametrize("value", [-3, True, 1.5, "2", None])
def test_attachment_refuses_a_warmup_that_is_not_a_whole_number(value):
    with pytest.raises(ValueError, match=r"warmup_steps must be a whole number >= 0"):
        RankAttachment(warmup_steps=value)


def test_callbacks_refuse_a_bad_warmup_when_built(tmp_path):
    pytest.importorskip("transformers")
    from powertrain.integrations.hf import PowertrainCallback

    with pytest.raises(ValueError, match="warmup_steps"):
        PowertrainCallback(tmp_path / "r", warmup_steps=-1)


# -- M6: $POWERTRAIN_RUN_DIR must name a running run -------------------------------------------------
@pytest.mark.parametrize(("status", "words"), [
    (None, "no run.json there"),
    ("ok", "status is 'ok'"),
    ("failed", "status is 'failed'"),
])
def test_env_run_dir_that_is_not_a_running_run_is_refused(tmp_path, monkeypatch, status, words):
    run = _run_dir(tmp_path / "r", status)
    monkeypatch.setenv(hooks.RUN_DIR_ENV, str(run))
    with pytest.raises(ValueError) as err:
        powertrain.step(1)
    msg = str(err.value)
    assert "\n" not in msg and words in msg, msg
    assert f"$POWERTRAIN_RUN_DIR={run}" in msg
    assert "unset POWERTRAIN_RUN_DIR, or run this under powertrain monitor / powertrain run" in msg
    assert not (run / "events").exists()  # nothing written into it


def test_env_run_dir_with_a_damaged_run_json_is_refused(tmp_path, monkeypatch):
    run = _run_dir(tmp_path / "r", None)
    (run / "run.json").write_text("{not json")
    monkeypatch.setenv(hooks.RUN_DIR_ENV, str(run))
    with pytest.raises(ValueError, match=r"its run\.json cannot be read"):
        hooks.configure()


def test_a_refused_env_run_dir_leaves_the_recorder_in_place(tmp_path, monkeypatch):
    rec = hooks.configure(tmp_path / "mine")
    monkeypatch.setenv(hooks.RUN_DIR_ENV, str(_run_dir(tmp_path / "old", "ok")))
    with pytest.raises(ValueError, match="not a running run"):
        hooks.configure()
    assert hooks.get() is rec and rec.enabled


def test_env_run_dir_of_a_running_run_is_used(tmp_path, monkeypatch):
    run = _run_dir(tmp_path / "r")
    monkeypatch.setenv(hooks.RUN_DIR_ENV, str(run))
    monkeypatch.setenv("RANK", "2")
    with powertrain.step(7, tokens=3):
        pass
    hooks.close()
    assert [(e["rank"], e["step"]) for e in read_events(run).to_pylist()] == [(2, 7)]


def test_an_explicit_run_dir_needs_no_run_json(tmp_path):
    # configure(run_dir) from Python names the folder on purpose (a plain events folder is allowed)
    rec = hooks.configure(tmp_path / "events-only")
    with rec.step(0):
        pass
    rec.close()
    assert [e["step"] for e in read_events(tmp_path / "events-only").to_pylist()] == [0]


def test_attachment_refuses_an_env_run_dir_that_has_ended(tmp_path, monkeypatch):
    run = _run_dir(tmp_path / "r", "ok")
    monkeypatch.setenv(hooks.RUN_DIR_ENV, str(run))
    att = RankAttachment()
    with pytest.raises(ValueError, match="status is 'ok'"):
        att.start(rank=0, local_rank=0, world_size=1)
    assert not att.active and not (run / "events").exists()


def test_a_command_under_the_monitor_marks_steps_into_its_run(tmp_path):
    # the legit route: run.json says running before the command starts, and until it has ended
    code = textwrap.dedent("""
        import powertrain
        for i in range(3):
            with powertrain.step(i, tokens=10):
                pass
    """)
    rc, info = run_command([sys.executable, "-c", code], tmp_path / "run", backends="host", echo=False)
    assert rc == 0 and info["status"] == "ok", info.get("reason")
    assert [e["step"] for e in read_events(tmp_path / "run").to_pylist()] == [0, 1, 2]


# -- L6: a public Prometheus address from Python names the Python fix ------------------------------
def test_monitor_refuses_a_public_prometheus_address_naming_the_variable(tmp_path):
    with pytest.raises(ValueError) as err:
        Monitor(tmp_path / "r", prometheus="0.0.0.0:0")
    msg = str(err.value)
    assert "\n" not in msg and "not a loopback address" in msg
    assert f"{PUBLIC_ENV}=1" in msg and "os.environ" in msg and "--prometheus-public" not in msg
    assert not (tmp_path / "r").exists()


def test_monitor_allows_a_public_prometheus_address_with_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(PUBLIC_ENV, "1")
    assert Monitor(tmp_path / "r", prometheus="0.0.0.0:0").prometheus == "0.0.0.0:0"
    assert Monitor(tmp_path / "r", prometheus="127.0.0.1:0").prometheus == "127.0.0.1:0"


def test_monitor_refuses_a_bad_prometheus_address_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match=r"prometheus='abc': expected \[HOST:\]PORT"):
        Monitor(tmp_path / "r", prometheus="abc")


def test_the_prometheus_variable_is_documented_with_the_other_variables():
    guide = (DOCS / "user-guide.md").read_text()
    table = guide[guide.index("| `POWERTRAIN_EVENTS_FLUSH_S` |"):].split("\n\n")[0]
    assert f"| `{PUBLIC_ENV}` |" in table


# -- L8: a rank is a whole number >= 0 ---------------------------------------------------------------
@pytest.mark.parametrize("rank", [-3, True, 1.5, "1"])
def test_configure_and_bind_refuse_a_rank_that_is_not_a_whole_number(tmp_path, rank):
    with pytest.raises(ValueError, match="rank must be a whole number >= 0"):
        hooks.configure(tmp_path, rank=rank)
    with pytest.raises(ValueError, match="rank must be a whole number >= 0"):
        hooks.bind(tmp_path, rank=rank)
    assert not (tmp_path / "events").exists()


def test_configure_takes_a_numpy_rank_as_an_int(tmp_path):
    rec = hooks.configure(tmp_path, rank=np.int64(2))
    assert rec.rank == 2 and type(rec.rank) is int


# -- L9: under powertrain monitor, a loop marks both windows or neither -------------------------------
def test_a_loop_that_marks_only_its_warmup_under_a_run_leaves_the_rest_unmarked(tmp_path, monkeypatch):
    run = _run_dir(tmp_path / "r")
    monkeypatch.setenv(hooks.RUN_DIR_ENV, str(run))
    with powertrain.window("warmup"):
        for i in range(2):
            with powertrain.step(i):
                pass
    for i in range(2, 4):
        with powertrain.step(i):
            pass
    hooks.close()
    assert [e["window"] for e in read_events(run).to_pylist()] == ["warmup", "warmup", None, None]
    guide = (DOCS / "user-guide.md").read_text()
    assert "**Windows: mark both or neither.**" in guide and 'powertrain.set_window("measured")' in guide


# -- L10: $POWERTRAIN_FAULT ----------------------------------------------------------------------------
def test_fault_variable_forms():
    trainer = pytest.importorskip("powertrain.workload.trainer")
    assert trainer.parse_fault(None) is None and trainer.parse_fault("") is None
    assert trainer.parse_fault("1:8") == trainer.Fault(1, 8, False)
    assert trainer.parse_fault("0:2:kill") == trainer.Fault(0, 2, True)


@pytest.mark.parametrize("value", ["0-2", "1", "1:8:KILL", "1:8:9", "a:1", "-1:2", "1:", " : "])
def test_a_malformed_fault_variable_is_refused_listing_the_forms(value):
    trainer = pytest.importorskip("powertrain.workload.trainer")
    with pytest.raises(ValueError) as err:
        trainer.parse_fault(value)
    msg = str(err.value)
    assert "\n" not in msg and "POWERTRAIN_FAULT=" in msg and "RANK:STEP" in msg and "RANK:STEP:kill" in msg


def test_the_trainer_refuses_a_malformed_fault_and_injects_a_good_one(monkeypatch):
    trainer = pytest.importorskip("powertrain.workload.trainer")
    from powertrain.spec.run import RunConfig

    cfg = RunConfig(model={"name": "llama-test", "family": "llama", "layers": 1, "hidden": 16, "ffn": 32,
                           "heads": 2, "kv_heads": 2, "vocab": 64, "seq_len": 8}, knobs={"global_batch": 2})
    monkeypatch.setenv("POWERTRAIN_FAULT", "0-1")
    with pytest.raises(ValueError, match="POWERTRAIN_FAULT='0-1' is not a fault"):
        trainer.Trainer(cfg)
    monkeypatch.setenv("POWERTRAIN_FAULT", "0:1")
    t = trainer.Trainer(cfg)
    t.step(0)
    with pytest.raises(RuntimeError, match=r"injected fault \(POWERTRAIN_FAULT\) on rank 0 at step 1"):
        t.step(1)
