"""What a value must look like to reach a generated Slurm batch script.

Every value a sweep writes into its ``#SBATCH`` lines is checked here against a strict pattern of
what Slurm itself accepts (partition, account and QoS names, the ``slurm_extra`` options) — once when
the spec is read (:class:`powertrain.plan.sweep_spec.LaunchOptions`) and again when the script is
written (:func:`powertrain.launch.sweep.sbatch_script`). A failed check raises ``ValueError`` with
one line naming the field; the value is shown with its control characters escaped.

``slurm_extra`` is an allow-list (:data:`ALLOWED`): each item is one long option, written out in
full, whose value matches that option's pattern. What is not on it is refused, and the options
that would let a spec run code or touch files (:data:`REFUSED`: ``--export`` with a ``BASH_ENV`` or
``PYTHONPATH``, ``--error``/``--output`` over any file, ``--chdir``) or hold the job without a bound
(``--hold``, ``--begin``, ``--dependency``) are refused saying why and what to do instead. sbatch
reads a unique prefix of a long option as the option (``--er`` is ``--error``), so only full names
pass; and every option that takes a value takes it in the same item (``--key=value``): a value in
the next item would reach sbatch as an argument of its own.

``#SBATCH`` lines are comments to bash but are parsed by ``sbatch``, which splits them at white
space, ends them at an unescaped ``#`` and reads ``"`` and ``\\`` as quoting: :func:`directive_word`
writes a path so that ``sbatch`` reads it back unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from powertrain.spec.bounds import control_char

# Slurm names: letters, digits, ``_ . -`` (partition and QoS may be comma lists).
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
NAME_LIST = re.compile(r"[A-Za-z0-9_.-]{1,64}(,[A-Za-z0-9_.-]{1,64}){0,31}")
# the shape of one item: a long option, with or without a value (each value has its own pattern in ALLOWED)
OPTION = re.compile(r"--(?P<key>[a-z][a-z0-9-]{0,40})(?P<eq>=(?P<value>.*))?", re.S)
JOB_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.+-]")
# options the generated script sets from the spec's own fields (the field to use instead)
OWN_OPTIONS = {"job-name": "it is made from the sweep's name", "nodes": "set base.hardware.nodes",
               "ntasks-per-node": "drop it: each node runs one task", "time": "set launch.time_limit_min",
               "output": "drop it: job output goes to <results folder>/.launch/<run>-<job>.out",
               "partition": "set launch.partition", "account": "set launch.account", "qos": "set launch.qos",
               "wrap": "drop it: the job runs `powertrain run`"}

_HOSTS = r"[A-Za-z0-9_.,\[\]-]{1,1024}"  # a Slurm host list (node[1-4,7]); no `/`: sbatch reads that as a file
_MEM = r"[0-9]{1,9}[KMGT]?"
_MAIL_TYPES = ("NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT", "TIME_LIMIT",
               "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS")
_MAIL_TYPE = "|".join(_MAIL_TYPES)


@dataclass(frozen=True)
class Allowed:
    """An sbatch option a spec may add: the pattern of its value (None: it takes none) and what it is."""

    pattern: str | None
    shape: str
    optional: bool = False  # the value may be left out (``--exclusive``)


# The sbatch options a spec may add. Each leaves the job's environment, its files and how long it may
# wait as the sweep sets them: resources, placement, accounting labels and mail only.
ALLOWED: dict[str, Allowed] = {
    "exclusive": Allowed("user|mcs|topo", "user, mcs or topo (or no value)", optional=True),
    "constraint": Allowed(r"[A-Za-z0-9_.,:&|*\[\]-]{1,256}", "node features such as a100&ib or [h100|h200]"),
    "gres": Allowed(r"[A-Za-z0-9_.:,-]{1,256}", "generic resources such as gpu:8 or gpu:a100:4"),
    "gpus-per-node": Allowed(r"([A-Za-z0-9_.-]{1,64}:)?[1-9][0-9]{0,2}", "[TYPE:]COUNT such as 8 or h100:8"),
    "cpus-per-task": Allowed(r"[1-9][0-9]{0,3}", "a count of CPUs such as 16"),
    "mem": Allowed(_MEM, "memory per node such as 64G (0: all of it)"),
    "mem-per-cpu": Allowed(_MEM, "memory per CPU such as 4G"),
    "mem-per-gpu": Allowed(_MEM, "memory per GPU such as 80G"),
    "nodelist": Allowed(_HOSTS, "node names or a host list such as gpu[01-04]"),
    "exclude": Allowed(_HOSTS, "node names or a host list such as gpu[05,07]"),
    "reservation": Allowed(NAME_LIST.pattern, "a reservation name (letters, digits, _ . -)"),
    "mail-type": Allowed(rf"({_MAIL_TYPE})(,({_MAIL_TYPE})){{0,12}}", f"a comma list of {', '.join(_MAIL_TYPES)}"),
    "mail-user": Allowed(r"[A-Za-z0-9_.+-]{1,64}(@[A-Za-z0-9.-]{1,190})?", "a user name or mail address"),
    "comment": Allowed(r"[A-Za-z0-9_.,:=+@/-]{1,256}", "one word of letters, digits and _ . , : = + @ / -"),
    "switches": Allowed(r"[1-9][0-9]{0,2}(@[0-9][0-9:-]{0,15})?", "COUNT[@MAX-WAIT] such as 1 or 1@10:00"),
    "nice": Allowed(r"[0-9]{1,5}", "a non-negative niceness such as 10"),
    "licenses": Allowed(r"[A-Za-z0-9_.:,@-]{1,256}", "licenses such as matlab:2"),
    "wckey": Allowed(NAME.pattern, "a workload key (letters, digits, _ . -)"),
    "no-requeue": Allowed(None, "nothing"),
}
_ALLOWED_SHOWN = ", ".join(f"--{k}" + ("" if a.pattern is None else "[=…]" if a.optional else "=…")
                           for k, a in ALLOWED.items())
_AFTER_RUN = "drop it: the sweep submits each run to start once resources are free, within launch.pending_limit_min"
_ENV = ("the job inherits the environment `powertrain sweep` was started in: set variables there "
        "(a BASH_ENV or PYTHONPATH set here would run code)")
_OUT = "drop it: job output goes to <results folder>/.launch/<run>-<job>.out"
# sbatch options refused for what they would do (the fix is said in the message), beyond "not allowed"
REFUSED: dict[str, tuple[str, str]] = {
    "export": ("sets the job's environment", _ENV),
    "export-file": ("sets the job's environment from a file", _ENV),
    "get-user-env": ("replaces the job's environment with a login shell's", _ENV),
    "propagate": ("passes the submitting shell's resource limits to the job", "drop it"),
    "error": ("writes the job's errors to a file it names (overwriting it)", _OUT),
    "input": ("feeds the job a file", "drop it: `powertrain run` reads its spec from .specs/"),
    "open-mode": ("changes how the job's output files are opened", _OUT),
    "chdir": ("changes the folder the job runs in", "drop it: the job runs where `powertrain sweep` was started"),
    "hold": ("submits the job held until someone releases it (the sweep would wait for ever)", _AFTER_RUN),
    "begin": ("delays the job's start", _AFTER_RUN),
    "dependency": ("makes the job wait for other jobs", _AFTER_RUN),
    "deadline": ("drops the job at a date", _AFTER_RUN),
    "array": ("runs the script several times into one run directory", "drop it: the grid makes one job per run"),
    "requeue": ("runs the job again into the run directory it already wrote", "drop it: use launch.retries"),
    "clusters": ("submits to another cluster, where the sweep cannot follow the job",
                 "drop it: run `powertrain sweep` on that cluster"),
    "uid": ("runs the job as another user", "drop it"),
    "gid": ("runs the job as another group", "drop it"),
    "container": ("runs the job inside a container", "drop it"),
    "bb": ("stages files with a burst buffer script", "drop it"),
    "bbf": ("stages files with a burst buffer script", "drop it"),
    "wait": ("makes sbatch wait for the job", "drop it: the sweep follows the job itself"),
    "parsable": ("changes how sbatch answers the sweep", "drop it"),
    "test-only": ("submits nothing", "drop it"),
    "reboot": ("reboots the nodes", "drop it"),
    "gpu-freq": ("sets GPU clocks under the sweep's own", "use knobs.sm_clock_mhz / mem_clock_mhz"),
    "cpu-freq": ("sets CPU clocks", "drop it"),
    "power": ("sets power options under the sweep's own", "use knobs.power_limit_w"),
    "signal": ("signals the job before its time limit", "drop it: launch.time_limit_min bounds the run"),
    "time-min": ("lets Slurm shorten the job's time limit", "use launch.time_limit_min"),
    "ntasks": ("changes the one task per node the script runs", "drop it"),
}
# every long option sbatch 22.05-23.x reads, to name what an abbreviation stands for (getopt takes any
# unique prefix)
SBATCH_OPTIONS = sorted({*ALLOWED, *REFUSED, *OWN_OPTIONS, "acctg-freq", "batch", "burst-buffer-file",
                         "cluster-constraint", "contiguous", "core-spec", "cores-per-socket", "cpus-per-gpu",
                         "delay-boot", "distribution", "extra-node-info", "gpu-bind", "gpus", "gpus-per-socket",
                         "gpus-per-task", "gres-flags", "help", "hint", "ignore-pbs", "kill-on-invalid-dep",
                         "mcs-label", "mem-bind", "mincpus", "network", "no-kill", "nodefile", "ntasks-per-core",
                         "ntasks-per-gpu", "ntasks-per-socket", "overcommit", "oversubscribe", "priority",
                         "profile", "quiet", "sockets-per-node", "spread-job", "thread-spec", "threads-per-core",
                         "tmp", "tres-per-task", "usage", "use-min-nodes", "verbose", "version", "wait-all-nodes"})
# sbatch's short options, named by their long form (a short option is never allowed: write the long one)
SHORT_OPTIONS = {"a": "array", "A": "account", "b": "begin", "c": "cpus-per-task", "C": "constraint",
                 "d": "dependency", "D": "chdir", "e": "error", "F": "nodefile", "G": "gpus", "H": "hold",
                 "i": "input", "I": "immediate", "J": "job-name", "k": "no-kill", "L": "licenses", "m": "distribution",
                 "M": "clusters", "n": "ntasks", "N": "nodes", "o": "output", "O": "overcommit", "p": "partition",
                 "q": "qos", "Q": "quiet", "s": "oversubscribe", "S": "core-spec", "t": "time", "v": "verbose",
                 "W": "wait", "w": "nodelist", "x": "exclude"}


def check_name(field: str, value: str, allow_list: bool = False) -> str:
    """``value`` when it is a Slurm partition/account/QoS name (or comma list), else ``ValueError``."""
    pattern = NAME_LIST if allow_list else NAME
    if not pattern.fullmatch(value):
        what = control_char(value)
        why = f"holds {what}" if what else "is not a Slurm name (letters, digits, _ . - only" + \
            (", names separated by commas)" if allow_list else ")")
        raise ValueError(f"{field} {value!r} {why}")
    return value


def _refusal(field: str, value: str, key: str, given: str) -> str:
    """Why the sbatch option ``key`` (written ``given``) is refused: one line with the fix."""
    abbrev = "" if given == f"--{key}" else f" (which {given} abbreviates)"
    if key in OWN_OPTIONS:
        return f"{field} {value!r} sets --{key}{abbrev}, which the generated script sets itself; {OWN_OPTIONS[key]}"
    if key in REFUSED:
        what, fix = REFUSED[key]
        return f"{field} {value!r} is refused: --{key}{abbrev} {what}; {fix}"
    return (f"{field} {value!r}: --{key}{abbrev} is not an sbatch option a sweep passes on; drop it "
            f"(allowed: {_ALLOWED_SHOWN})")


def check_option(field: str, value: str) -> str:
    """``value`` when it is one allowed sbatch option for ``#SBATCH`` (:data:`ALLOWED`), written out in
    full with its value in the same item, else ``ValueError`` naming ``field``, the option and the fix."""
    what = control_char(value)
    if what:
        raise ValueError(f"{field} {value!r} holds {what}")
    short = re.match(r"-([A-Za-z])", value)
    if short and short.group(1) in SHORT_OPTIONS:
        key = SHORT_OPTIONS[short.group(1)]
        if key not in ALLOWED:
            raise ValueError(_refusal(field, value, key, f"-{short.group(1)}"))
        raise ValueError(f"{field} {value!r} is a short option (-{short.group(1)} is --{key}); write the long form "
                         f"--{key}{'' if ALLOWED[key].pattern is None else '=VALUE'} in one item")
    m = OPTION.fullmatch(value)
    if m is None:
        raise ValueError(f"{field} {value!r} is not one --key or --key=value sbatch option (long form, no spaces; "
                         "a value goes in the same item as its option)")
    key, has_value, arg = m.group("key"), m.group("eq") is not None, m.group("value") or ""
    if key not in ALLOWED:
        # sbatch (getopt_long) takes an exact name first, else a prefix: --er=… is --error=…
        named = [key] if key in SBATCH_OPTIONS else [k for k in SBATCH_OPTIONS if k.startswith(key)]
        danger = [k for k in named if k in OWN_OPTIONS or k in REFUSED]
        ok = [k for k in named if k in ALLOWED]
        if not danger and ok:
            raise ValueError(f"{field} {value!r}: write the option out in full (--{ok[0]}); an abbreviation "
                             "may stand for another option in another sbatch")
        raise ValueError(_refusal(field, value, (danger or named or [key])[0], f"--{key}"))
    rule = ALLOWED[key]
    if rule.pattern is None:
        if has_value:
            raise ValueError(f"{field} {value!r}: --{key} takes no value; write --{key}")
    elif not has_value and not rule.optional:
        raise ValueError(f"{field} {value!r}: --{key} needs its value in the same item, --{key}=VALUE with VALUE "
                         f"{rule.shape} (a value in the next item would reach sbatch on its own)")
    elif has_value and not re.fullmatch(rule.pattern, arg):
        raise ValueError(f"{field} {value!r}: the value of --{key} must be {rule.shape}")
    return value


def job_name(text: str) -> str:
    """A Slurm job name from ``text``: anything outside ``A-Z a-z 0-9 _ . + -`` becomes ``-``."""
    return JOB_NAME_CHARS.sub("-", text)[:120] or "pt"


def directive_word(field: str, text: str, pattern: str = "") -> str:
    """``text`` (a path) as one ``sbatch`` directive argument, read back unchanged by ``sbatch``, with
    ``pattern`` (Slurm filename pattern characters such as ``-%j.out``, trusted) appended as is.

    Slurm filename patterns read ``%`` specially (written ``%%``) and turn a backslash into "no
    patterns at all", so a backslash is refused; newlines and NULs too.
    """
    what = control_char(text)
    if what:
        raise ValueError(f"{field} {text!r} holds {what}")
    if "\\" in text:
        raise ValueError(f"{field} {text!r} holds a backslash, which Slurm's --output cannot hold; use another folder")
    escaped = text.replace("%", "%%").replace('"', '\\"').replace("#", "\\#")
    return f'"{escaped}{pattern}"'
