"""The whole catalogue as pytest tests: ``pytest --pyargs vz_conformance.pytest_suite --vz-driver NAME``."""

from __future__ import annotations

from vz_conformance.pytest_plugin import test_vz_conformance

__all__ = ["test_vz_conformance"]
