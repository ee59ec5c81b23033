"""The shared vocabulary at the bottom of powertrain: definitions every layer uses and none owns.

Modules here import nothing from the rest of powertrain (only the standard library and numpy), so
any package may import them without creating a cycle.
"""
