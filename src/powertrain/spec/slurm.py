"""What a value must look like to reach a generated Slurm batch script.

Every value a sweep writes into its ``#SBATCH`` lines is checked here against a strict pattern of
what Slurm itself accepts (partition, account and QoS names, ``--key=value`` options) — once when
the spec is read (:class:`powertrain.plan.sweep_spec.LaunchOptions`) and again when the script is
written (:func:`powertrain.launch.sweep.sbatch_script`). A failed check raises ``ValueError`` with
one line naming the field; the value is shown with its control characters escaped.

``#SBATCH`` lines are comments to bash but are parsed by ``sbatch``, which splits them at white
space, ends them at an unescaped ``#`` and reads ``"`` and ``\\`` as quoting: :func:`directive_word`
writes a path so that ``sbatch`` reads it back unchanged.
"""

from __future__ import annotations

import re

from powertrain.spec.bounds import control_char

# Slurm names: letters, digits, ``_ . -`` (partition and QoS may be comma lists).
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
NAME_LIST = re.compile(r"[A-Za-z0-9_.-]{1,64}(,[A-Za-z0-9_.-]{1,64}){0,31}")
# one long option, with or without a value; no white space, quotes, backslashes, `#` or shell syntax
OPTION = re.compile(r"--(?P<key>[a-z][a-z0-9-]{0,40})(=(?P<value>[A-Za-z0-9_.,:=/@%+*&|!\[\]-]{1,256}))?")
JOB_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.+-]")
# options the generated script sets from the spec's own fields (the field to use instead)
OWN_OPTIONS = {"job-name": "the sweep's name", "nodes": "base.hardware.nodes", "ntasks-per-node": "(always 1)",
               "time": "launch.time_limit_min", "output": "the results folder (--out)",
               "partition": "launch.partition", "account": "launch.account", "qos": "launch.qos",
               "wrap": "(a sweep runs `powertrain run`)"}


def check_name(field: str, value: str, allow_list: bool = False) -> str:
    """``value`` when it is a Slurm partition/account/QoS name (or comma list), else ``ValueError``."""
    pattern = NAME_LIST if allow_list else NAME
    if not pattern.fullmatch(value):
        what = control_char(value)
        why = f"holds {what}" if what else "is not a Slurm name (letters, digits, _ . - only" + \
            (", names separated by commas)" if allow_list else ")")
        raise ValueError(f"{field} {value!r} {why}")
    return value


def check_option(field: str, value: str) -> str:
    """``value`` when it is one ``--key`` or ``--key=value`` option for ``#SBATCH``, else ``ValueError``."""
    m = OPTION.fullmatch(value)
    if m is None:
        what = control_char(value)
        why = f"holds {what}" if what else (
            "is not one --key or --key=value option (long form; no spaces, quotes, `#`, `$`, `;` or backticks)")
        raise ValueError(f"{field} {value!r} {why}")
    key = m.group("key")
    # sbatch (getopt_long) takes any unique prefix of a long option: --outp=... is --output=...
    own = next((k for k in OWN_OPTIONS if k.startswith(key)), None)
    if own is not None:
        abbrev = "" if own == key else f" (an abbreviation of --{own}, which sbatch accepts)"
        raise ValueError(f"{field} {value!r} sets --{own}{abbrev}, which the generated script sets itself: use "
                         f"{OWN_OPTIONS[own]}")
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
