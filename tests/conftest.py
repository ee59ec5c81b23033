"""Shared fixtures. Tests run against the installed package (editable) in .venv."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("POWERTRAIN_SHARED", REPO.parent / "shared"))


@pytest.fixture
def python() -> str:
    """The interpreter of this test session (the project's venv)."""
    return sys.executable


@pytest.fixture
def shared_data() -> Path:
    """../shared/data, or a skip saying where it was looked for."""
    path = SHARED / "data"
    if not path.is_dir():
        pytest.skip(f"shared data not found at {path} (set POWERTRAIN_SHARED)")
    return path
