"""The reading rules of published runs, as data (``data/reading_rules.yaml``): which words of a run's framework
or source reference decide its era, its attention kernel, its FLOP convention, its unstated recomputation and its
short source label.

The published-run reader (:mod:`powertrain.predict.published`) asks these rules and never names a source, a
commit or an author itself; every rule carries the reason and the source of the fact it encodes, so a reader of
a prediction can audit why a run was read the way it was (issue 31).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from powertrain.core.yamlfile import load_yaml_file

RULES_FILE = Path(__file__).with_name("data") / "reading_rules.yaml"
_WHERE = ("framework", "reference", "both")


@dataclass(frozen=True, slots=True)
class Match:
    """Words (lower case) a run's text must hold: ``any`` one of, ``all`` of, ``none`` of, or a ``pattern``."""

    any: tuple[str, ...] = ()
    all: tuple[str, ...] = ()
    none: tuple[str, ...] = ()
    pattern: re.Pattern[str] | None = None
    where: str = "both"

    def text(self, framework: str, reference: str) -> str:
        if self.where == "framework":
            return framework.lower()
        if self.where == "reference":
            return reference.lower()
        return f"{framework} {reference}".lower()

    def found(self, framework: str, reference: str = "") -> re.Match[str] | bool:
        """Whether the rule matches (the regular expression's match where it has a pattern)."""
        t = self.text(framework, reference)
        if self.any and not any(w in t for w in self.any):
            return False
        if self.all and not all(w in t for w in self.all):
            return False
        if any(w in t for w in self.none):
            return False
        if self.pattern is not None:
            return self.pattern.search(t) or False
        return True


@dataclass(frozen=True, slots=True)
class Rule:
    id: str
    match: Match
    value: dict[str, Any]  # what the rule sets (era, mode, counts, label, …)
    reason: str
    source: str


@dataclass(frozen=True, slots=True)
class ReadingRules:
    eras: tuple[Rule, ...]
    modelled_frameworks: Rule
    flash2_attention: Rule
    unstated_recompute: tuple[Rule, ...]
    tflops_counts: tuple[Rule, ...]
    source_labels: tuple[Rule, ...]
    force_balanced_phrase: str
    defaults_by_era: dict[str, dict[str, bool]]

    def defaults(self, era: str) -> dict[str, bool]:
        """What ``era`` does where a run does not say (``era_defaults``); an era without an entry is refused."""
        if era not in self.defaults_by_era:
            raise ValueError(f"{RULES_FILE}: era {era!r} has no era_defaults entry")
        return self.defaults_by_era[era]

    def first(self, rules: tuple[Rule, ...], framework: str, reference: str = "") -> Rule | None:
        return next((r for r in rules if r.match.found(framework, reference)), None)

    def era(self, framework: str, reference: str) -> str:
        rule = self.first(self.eras, framework, reference)
        return str(rule.value["era"]) if rule else "megatron-core"

    def recompute_for_era(self, era: str) -> Rule | None:
        """The rule that fills an unstated recomputation for ``era``, or None (the least that fits)."""
        return next((r for r in self.unstated_recompute if r.value.get("era") == era), None)

    def tflops_count(self, reference: str) -> str:
        """"hardware" (the source's TFLOP/s count recomputation) or "model"."""
        rule = self.first(self.tflops_counts, "", reference)
        return str(rule.value["counts"]) if rule else "model"

    def source_label(self, reference: str) -> str:
        for rule in self.source_labels:
            found = rule.match.found("", reference)
            if not found:
                continue
            if "label" in rule.value:
                return str(rule.value["label"])
            groups = [g for g in found.groups() if g] if isinstance(found, re.Match) else []
            if groups:
                return str(rule.value["label_from_pattern"]).format(groups[0])
        return reference[:24]


def _match(raw: Any, rule_id: str) -> Match:
    if raw is None:  # a rule keyed on something else (an era): no words to match
        return Match()
    if not isinstance(raw, dict):
        raise ValueError(f"{RULES_FILE}: rule {rule_id!r} has no match mapping")
    where = str(raw.get("in", "both"))
    if where not in _WHERE:
        raise ValueError(f"{RULES_FILE}: rule {rule_id!r}: `in` must be one of {', '.join(_WHERE)}, not {where!r}")
    words = {k: tuple(str(w).lower() for w in raw.get(k) or ()) for k in ("any", "all", "none")}
    pattern = re.compile(str(raw["pattern"])) if raw.get("pattern") else None
    return Match(words["any"], words["all"], words["none"], pattern, where)


def _rule(raw: Any) -> Rule:
    if not isinstance(raw, dict) or not raw.get("id"):
        raise ValueError(f"{RULES_FILE}: every rule is a mapping with an id, not {raw!r}")
    rid = str(raw["id"])
    value = {k: v for k, v in raw.items() if k not in ("id", "match", "reason", "source")}
    return Rule(rid, _match(raw.get("match"), rid), value, str(raw.get("reason", "")), str(raw.get("source", "")))


@cache
def reading_rules() -> ReadingRules:
    """The packaged rules, read once."""
    raw = load_yaml_file(RULES_FILE, "reading rules") or {}
    rules = {k: tuple(_rule(r) for r in raw.get(k) or ()) for k in
             ("eras", "unstated_recompute", "tflops_counts", "source_labels")}
    balanced = raw.get("force_balanced_caveat") or {}
    return ReadingRules(rules["eras"], _rule(raw["modelled_frameworks"]), _rule(raw["flash2_attention"]),
                        rules["unstated_recompute"], rules["tflops_counts"], rules["source_labels"],
                        str(balanced.get("phrase", "")).lower(),
                        {str(k): {f: bool(v) for f, v in d.items()} for k, d in (raw.get("era_defaults") or {}).items()})
