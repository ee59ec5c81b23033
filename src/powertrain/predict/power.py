"""Node power at the wall: the one formula predict and advise use for it.

A device's own power is the physics of :mod:`powertrain.predict.dvfs` (what a kind of work draws at a
clock), :mod:`powertrain.predict.timeline` (a step's phases in schedule order) and
:mod:`powertrain.predict.governor` (the clock a power limit leaves); :mod:`powertrain.predict.physics` puts
them together. A node adds its host — CPUs by load, memory, NICs, NVSwitches, fans by heat — and loses the
power supplies' conversion, term by term from the catalog's node description
(:mod:`powertrain.predict.node_power`). :func:`node_dc_w` and :func:`node_power_w` are the totals callers use.
"""

from __future__ import annotations

from powertrain.hardware import DeviceSpec


def node_dc_w(devices_w: float, nodes: float, dev: DeviceSpec, *, ranks_per_node: int | None = None,
              training: bool = True) -> float | None:
    """The DC load of ``nodes`` nodes of ``dev`` whose devices draw ``devices_w`` together: the devices plus each
    node's host terms from the catalog's node description (:func:`powertrain.predict.node_power.node_power`; what
    an MLPerf DC power log reads). None where the catalog describes no host for the node (``node_power`` says
    why); ``training=False``: an idle host."""
    from powertrain.predict.node_power import nodes_power

    p = nodes_power(devices_w, nodes, dev, ranks_per_node=ranks_per_node, training=training)
    return None if p.dc_w is None else p.dc_w * nodes


def node_power_w(devices_w: float, nodes: float, dev: DeviceSpec, *, ranks_per_node: int | None = None,
                 training: bool = True) -> float | None:
    """Wall (AC) power of those nodes: their DC load through the power supplies (80 PLUS Titanium efficiency at
    the supplies' load share). What a facility meter or an MLPerf AC power log reads; the one formula for node
    power that predict and advise use (:func:`powertrain.predict.node_power.node_power` term by term). None where
    the node's host is not described."""
    from powertrain.predict.node_power import nodes_power

    p = nodes_power(devices_w, nodes, dev, ranks_per_node=ranks_per_node, training=training)
    return None if p.ac_w is None else p.ac_w * nodes
