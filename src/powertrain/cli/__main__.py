"""``python -m powertrain.cli`` — the same as the ``powertrain`` console script."""

from powertrain.cli import main

main()
