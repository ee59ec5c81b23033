"""``powertrain restore``: put back the device settings a killed run left on this node."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from powertrain.cli.root import app

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


@app.command("restore")
def restore_cmd(
    list_only: Annotated[bool, typer.Option("--list", help="Only show the ledger's entries; change nothing.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Also restore devices whose run still runs (it loses its "
                                                        "power limit / clock lock).")] = False,
) -> None:
    """Restore the power limits and clock locks that powertrain runs changed on this node and did not
    put back (a run killed with -9, a node that lost power mid-run).

    Every run that sets a device control first writes what the device had to the node's ledger
    ($POWERTRAIN_CONTROL_LEDGER, default /var/tmp/powertrain/control-ledger.json) and removes it
    once restored. This command restores every entry whose run is gone; the next `powertrain run`
    on the node does the same by itself. Needs the same rights as setting them (root).

    Exit status: 0 when nothing is left to restore, 1 when an entry could not be restored (it stays
    in the ledger, with the reason).

    Example:  sudo powertrain restore          (or: powertrain restore --list)
    """
    if list_only and force:
        err.print("error: --list changes nothing and --force changes what it restores: drop one of them",
                  markup=False, highlight=False, style="red")
        raise typer.Exit(2)
    from powertrain.control.ledger import Ledger, owner_alive
    from powertrain.launch.controls import restore_left_over

    ledger = Ledger()
    if list_only:
        entries = ledger.entries()
        for e in entries:
            o = e.get("owner", {})
            state = "run still alive" if owner_alive(o) else "run gone: restore it"
            out.print(escape(f"{e.get('vendor')} {e.get('device')} ({e.get('uuid')}): changed "
                             f"{', '.join(e.get('changed', []))}; found {e.get('found')}; run {o.get('run')} "
                             f"pid {o.get('pid')} — {state}"), highlight=False)
        out.print(f"{len(entries)} ledger entr{'y' if len(entries) == 1 else 'ies'} in {ledger.path}")
        return
    reports = restore_left_over(force=force)
    bad = [r for r in reports if r.get("problems")]
    for r in reports:
        what = "; ".join(r["problems"]) if r.get("problems") else f"restored {', '.join(r.get('changed') or [])}"
        out.print(escape(f"{r.get('device')} (run {r.get('run')}): {what}"), highlight=False)
    left = [e for e in ledger.entries() if owner_alive(e.get("owner", {}))]
    out.print(f"{len(reports) - len(bad)} restored, {len(bad)} not restored"
              + (f", {len(left)} held by live runs (left alone; --force restores them)" if left else ""))
    raise typer.Exit(1 if bad else 0)
