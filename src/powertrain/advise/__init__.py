"""advise: the best layout for a model on a cluster under power, thermal and memory limits.

Public API:

* :func:`make_request` — the job, limits and objective, checked (:class:`Request`, :class:`Constraints`,
  :class:`Objective`);
* :func:`advise` — enumerate (rules and memory first), predict, constrain and rank → :class:`Advice`;
* :func:`power_knee`, :func:`best_under_node_budget`, :func:`throttling_at_caps` — power in the loop;
* :func:`slot_profile`, :func:`place_stages` — thermal-aware placement of pipeline stages;
* :func:`emit_spec`, :func:`emit_sweep`, :func:`emit_flags` — what to run.
"""

from powertrain.advise.request import Constraints, Objective, Request, make_request
from powertrain.advise.search import Advice, NoFeasibleLayout, advise, as_dict, pareto_front

__all__ = [
    "Advice",
    "Constraints",
    "NoFeasibleLayout",
    "Objective",
    "Request",
    "advise",
    "as_dict",
    "make_request",
    "pareto_front",
]
