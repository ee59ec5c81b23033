"""Device controls: power limit and clock locks set before a run, recorded, and always restored."""
