"""The metric families of a run's ``summary.json``, one module each.

Every family reads the same :class:`~powertrain.analyze.families.context.RunContext` (the run, its
measured steps, the measurement window and the per-device telemetry statistics in it) and returns a
:class:`~powertrain.analyze.families.context.Family`: its metrics, why each of them that stays null is
null, and notes for the summary. :func:`powertrain.analyze.summary.summarize_run` composes them in a
fixed order (that order is the order of ``why_null`` and ``notes`` in ``summary.json``).
"""

from powertrain.analyze.families.balance import balance_family
from powertrain.analyze.families.clocks import clock_family
from powertrain.analyze.families.context import Family, RunContext, open_context
from powertrain.analyze.families.interconnect import interconnect_family
from powertrain.analyze.families.memory import memory_family
from powertrain.analyze.families.mfu import WorkFamily, work_family
from powertrain.analyze.families.overlap import OverlapFamily, overlap_family
from powertrain.analyze.families.power import EnergyFamily, PowerFamily, energy_family, power_family
from powertrain.analyze.families.step_time import step_family
from powertrain.analyze.families.thermal import thermal_family

__all__ = [
    "EnergyFamily",
    "Family",
    "OverlapFamily",
    "PowerFamily",
    "RunContext",
    "WorkFamily",
    "balance_family",
    "clock_family",
    "energy_family",
    "interconnect_family",
    "memory_family",
    "open_context",
    "overlap_family",
    "power_family",
    "step_family",
    "thermal_family",
    "work_family",
]
