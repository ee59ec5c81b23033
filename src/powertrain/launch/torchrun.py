"""``python -m powertrain.launch.torchrun ARGS`` — torchrun (``torch.distributed.run``), unchanged,
with the interpreter's last garbage collection skipped at exit (see :mod:`powertrain.fast_exit`).

The launcher outlives its ranks by that collection: with torch imported it walks about a million
objects, 2–3 s of CPU on a small host, and the run's end waits for it.
"""

from __future__ import annotations

from powertrain.fast_exit import skip_final_collection


def main() -> None:
    skip_final_collection()
    from torch.distributed.run import main as torchrun

    torchrun()


if __name__ == "__main__":
    main()
