"""The vz conformance suite: does a driver honour the Machine contract and the Runtime Protocol?

Three ways to run the same catalogue of cases:

* as a library: the plain ``check_*`` functions (``vz_conformance.checks``) each take a ``CheckContext``;
  ``run_suite`` runs whole labels against an ``InProcessProvider`` or an ``ExternalProvider`` (or both, for
  parity) and returns a ``Report``; ``verify`` applies the gate;
* as a pytest plugin (``vz_conformance.pytest_plugin``, loaded automatically): ``--vz-driver NAME`` or
  ``--vz-plugin PATH --vz-sha256 HEX``;
* as a CLI: ``vz-conformance run`` / ``verify-report`` / ``list`` / ``schema``.

A driver author describes their driver to the suite with an ``Adapter`` (image, mounts, the argv of each
command scenario). Names are imported on first use so that loading the pytest plugin or the fake driver's
registration stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vz_conformance._adapter import Adapter
    from vz_conformance._case import Case, CheckFn
    from vz_conformance._catalogue import CATALOGUE, LABELS, select
    from vz_conformance._context import CheckContext
    from vz_conformance._gate import GateResult, expected_count, verify
    from vz_conformance._outcome import NotApplicable, Outcome, Passed
    from vz_conformance._providers import DaemonProvider, DriverProvider, ExternalProvider, InProcessProvider
    from vz_conformance._report import CaseEntry, Report, load_report, schema
    from vz_conformance._runner import run_cases, run_suite

_WHERE = {
    "Adapter": "_adapter",
    "Case": "_case",
    "CheckFn": "_case",
    "CATALOGUE": "_catalogue",
    "LABELS": "_catalogue",
    "select": "_catalogue",
    "CheckContext": "_context",
    "GateResult": "_gate",
    "expected_count": "_gate",
    "verify": "_gate",
    "NotApplicable": "_outcome",
    "Outcome": "_outcome",
    "Passed": "_outcome",
    "DaemonProvider": "_providers",
    "DriverProvider": "_providers",
    "ExternalProvider": "_providers",
    "InProcessProvider": "_providers",
    "CaseEntry": "_report",
    "Report": "_report",
    "load_report": "_report",
    "schema": "_report",
    "run_cases": "_runner",
    "run_suite": "_runner",
}

__all__ = [
    "CATALOGUE",
    "LABELS",
    "Adapter",
    "Case",
    "CaseEntry",
    "CheckContext",
    "CheckFn",
    "DaemonProvider",
    "DriverProvider",
    "ExternalProvider",
    "GateResult",
    "InProcessProvider",
    "NotApplicable",
    "Outcome",
    "Passed",
    "Report",
    "expected_count",
    "load_report",
    "run_cases",
    "run_suite",
    "schema",
    "select",
    "verify",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
