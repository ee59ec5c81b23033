import numpy as np

from powertrain.core.counters import Unwrapper, unwrap, unwrap_array


def test_unwrap_with_modulus_adds_one_modulus_per_drop():
    assert unwrap([10, 250, 5, 100, 3], 256) == [10, 250, 261, 356, 515]


def test_unwrap_without_modulus_treats_drop_as_reset():
    # A reset (driver reload) continues from the last total instead of going backwards.
    assert unwrap([100, 150, 20, 30], None) == [100, 150, 170, 180]


def test_none_passes_through_without_breaking_chain():
    u = Unwrapper(2**32)
    assert [u(v) for v in [2**32 - 10, None, 5]] == [2**32 - 10, None, 2**32 + 5]


def test_unwrap_array_matches_scalar_version():
    raw = np.array([4e9, 4.2e9, 1e8, 3e9, 2e8], dtype=float)
    assert np.allclose(unwrap_array(raw, 2**32), unwrap(raw.tolist(), 2**32))
