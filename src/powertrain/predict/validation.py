"""Validation you can audit: which published-run sets are held out, how runs are prepared for scoring, the
throughput error per architecture and how often pairs of configurations are ordered right.

* :func:`ledger` reads ``data/validation_ledger.yaml``: every set is ``fit``, ``validation`` (with the commit and
  the reason that made it so) or ``clean``. Only clean sets give the accuracy figures that are quoted as held out
  (``powertrain predict``, the README, docs/model.md §9); a held-out file without an entry is refused.
* :func:`complete_recompute` fills a recomputation that neither the run nor a reading rule states with the least
  that fits the device — the one preparation step the reader cannot do alone (it needs the profile's memory
  coefficients). The benchmark, the CLI and the tests prepare runs through it, never differently.
* :func:`not_fitting`: published runs the memory model says do not fit (each a false verdict: they ran).
* :func:`comparable_pairs` / :func:`order_pairs`: pairs of runs from one source document and one software
  release, same model, hardware, device count, global batch, sequence and precision, that differ in layout,
  micro-batch or recomputation — what a user asks ``predict`` to choose between. A predicted tie (within
  :data:`PREDICTED_TIE`) counts wrong unless the measured pair is within :data:`MEASURED_TIE`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from powertrain.core.yamlfile import load_yaml_file
from powertrain.predict.calibration import Coefficients
from powertrain.predict.published import PublishedRun

LEDGER_FILE = Path(__file__).with_name("data") / "validation_ledger.yaml"
STATUSES = ("fit", "validation", "clean")
PREDICTED_TIE = 0.01  # predicted throughputs within 1 % of each other: the prediction does not choose
MEASURED_TIE = 0.03  # measured within 3 %: run-to-run noise of published tables; a predicted tie is right there
# What a pair may differ in (the user's choice); everything else of the Case must be equal.
_CHOICES = ("tp", "pp", "dp", "cp", "ep", "etp", "vp", "fsdp", "micro_batch", "recompute", "pp_schedule",
            "distributed_optimizer")
_SAME = ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "seq_len", "experts", "top_k", "moe_ffn",
         "shared_experts", "gated", "global_batch", "precision", "lora_rank", "world")


@dataclass(frozen=True, slots=True)
class SetRecord:
    """One set's entry of the ledger."""

    file: str
    status: str  # fit | validation | clean
    reason: str
    set: str | None = None  # its letter in data/README.md
    committed: str | None = None  # the commit that added it, before any prediction on it
    commit: str | None = None  # validation: the change that made it so
    read: tuple[str, ...] = ()  # the commits that recorded its readings

    @property
    def label(self) -> str:
        return f"set {self.set}" if self.set else self.file


@cache
def ledger() -> dict[str, SetRecord]:
    """The ledger's entries by file name, read once."""
    raw = load_yaml_file(LEDGER_FILE, "validation ledger") or {}
    out: dict[str, SetRecord] = {}
    for name, e in (raw.get("sets") or {}).items():
        status = str(e.get("status"))
        if status not in STATUSES:
            raise ValueError(f"{LEDGER_FILE}: {name}: status {status!r} is not one of {', '.join(STATUSES)}")
        if status == "validation" and not (e.get("commit") and e.get("reason")):
            raise ValueError(f"{LEDGER_FILE}: {name}: a validation set names the commit and reason that made it so")
        out[str(name)] = SetRecord(str(name), status, str(e.get("reason", "")), e.get("set"), e.get("committed"),
                                   e.get("commit"), tuple(str(c) for c in e.get("read") or ()))
    return out


def record_of(path: str | Path) -> SetRecord:
    """The ledger entry of a packaged set, or a ValueError naming the fix."""
    name = Path(path).name
    entry = ledger().get(name)
    if entry is None:
        raise ValueError(f"{name} has no entry in {LEDGER_FILE.name}: add it (status clean, validation or fit, with "
                         "its reason) before its figures are printed")
    return entry


def complete_recompute(runs: Iterable[PublishedRun], coefficients: Coefficients
                       ) -> tuple[list[PublishedRun], list[PublishedRun]]:
    """(usable, skipped) of published ``runs``: a recomputation neither stated nor filled by a reading rule
    becomes the least that fits (a framework that has to fit recomputes; see the module doc)."""
    from powertrain.predict.memory import least_recompute_that_fits

    usable, skipped = [], []
    for r in runs:
        if r.skip or r.case is None:
            skipped.append(r)
            continue
        if not r.recompute_stated and r.recompute_rule is None:
            r.case = replace(r.case, recompute=least_recompute_that_fits(r.case, coefficients))
        usable.append(r)
    return usable, skipped


@dataclass(frozen=True, slots=True)
class NotFitting:
    """A published run (which its source says ran) that the memory model says does not fit."""

    id: str
    need_over_capacity: float  # predicted bytes per device ÷ the device's memory
    assumed: tuple[str, ...]  # what the reader assumed about it (recompute, FSDP, …): where a false verdict starts


def not_fitting(runs: Iterable[PublishedRun], coefficients: Coefficients) -> list[NotFitting]:
    """Every run of ``runs`` predicted not to fit in its device's memory: each one is a false "does not fit"
    (the source says it ran), listed with the reader's assumptions about it."""
    from powertrain.predict.memory import memory_per_device

    out = []
    for r in runs:
        if r.case is None:
            continue
        total, _ = memory_per_device(r.case, coefficients)
        if total > r.case.device.memory_bytes:
            out.append(NotFitting(r.id, total / r.case.device.memory_bytes, tuple(r.assumptions)))
    return out


def _document(r: PublishedRun) -> tuple[str, str]:
    """(source document, software release) as the run states them."""
    raw = r.raw or {}
    return str((raw.get("source") or {}).get("ref", "")), str(raw.get("framework") or "")


def _key(r: PublishedRun) -> tuple[Any, ...]:
    assert r.case is not None
    c = r.case
    return (*_document(r), c.device.name, *(getattr(c, k) for k in _SAME))


def _choice(r: PublishedRun) -> tuple[Any, ...]:
    assert r.case is not None
    return tuple(getattr(r.case, k) for k in _CHOICES)


def comparable_pairs(runs: Iterable[PublishedRun]) -> list[tuple[PublishedRun, PublishedRun]]:
    """Every pair a user could be choosing between (module doc), each once, in file order."""
    groups: dict[tuple[Any, ...], list[PublishedRun]] = {}
    for r in runs:
        if r.case is not None and r.tokens_per_s_per_gpu:
            groups.setdefault(_key(r), []).append(r)
    return [(a, b) for g in groups.values() for a, b in itertools.combinations(g, 2) if _choice(a) != _choice(b)]


@dataclass(frozen=True, slots=True)
class OrderedPair:
    first: str
    second: str
    differs: str  # which choices differ, e.g. "micro_batch 1→2"
    measured_ratio: float  # second ÷ first, tokens/s per GPU
    predicted_ratio: float
    right: bool


def differs(a: PublishedRun, b: PublishedRun) -> str:
    assert a.case is not None and b.case is not None
    return ", ".join(f"{k} {getattr(a.case, k)}→{getattr(b.case, k)}" for k in _CHOICES
                     if getattr(a.case, k) != getattr(b.case, k))


def is_right(measured_ratio: float, predicted_ratio: float) -> bool:
    """The rule of the module doc: a predicted tie is right only on a measured near-tie; else the sign decides."""
    if abs(predicted_ratio - 1) < PREDICTED_TIE:
        return abs(measured_ratio - 1) < MEASURED_TIE
    return (predicted_ratio > 1) == (measured_ratio > 1) and measured_ratio != 1


def order_pairs(pairs: Iterable[tuple[PublishedRun, PublishedRun]], predicted: dict[str, float]) -> list[OrderedPair]:
    """Each pair judged with ``predicted`` tokens/s per GPU by run id."""
    out = []
    for a, b in pairs:
        assert a.tokens_per_s_per_gpu and b.tokens_per_s_per_gpu
        m = b.tokens_per_s_per_gpu / a.tokens_per_s_per_gpu
        p = predicted[b.id] / predicted[a.id]
        out.append(OrderedPair(a.id, b.id, differs(a, b), m, p, is_right(m, p)))
    return out
