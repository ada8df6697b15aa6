"""The catalogue is data with stable ids; counts per label are published; every case has its check function."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import vz_conformance
import vz_conformance.checks as checks
from vz_conformance import _capabilities as cap
from vz_conformance import _catalogue

# Published in docs/conformance.md; a change here is a change of the catalogue and must be documented.
COUNTS = {
    "discovery": 4,
    "lifecycle": 10,
    "exec": 22,
    "cancel": 3,
    "pty": 8,
    "malformed": 8,
    "logs": 3,
    "mounts": 5,
    "storage": 4,
    "resources": 2,
    "identity": 5,
    "recreate": 4,
    "egress": 3,
    "network": 9,
    "services": 3,
    "crash": 9,
    "checkpoint": 3,
}
DOC = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"


def test_counts_per_label() -> None:
    assert Counter(c.label for c in _catalogue.CATALOGUE) == COUNTS
    assert len(_catalogue.select("external")) == sum(COUNTS.values()) == 105
    assert len(_catalogue.select("in-process")) == sum(COUNTS.values()) - COUNTS["crash"] == 96


def test_ids_are_stable_label_dot_name_and_unique() -> None:
    ids = [c.id for c in _catalogue.CATALOGUE]
    assert len(ids) == len(set(ids))
    for case in _catalogue.CATALOGUE:
        assert re.fullmatch(r"[a-z]+\.[a-z0-9_]+", case.id), case.id
        assert case.label in _catalogue.LABELS
        assert case.description and case.check.__doc__


def test_only_crash_cases_are_external_only() -> None:
    for case in _catalogue.CATALOGUE:
        expected = ("external",) if case.label == "crash" else ("in-process", "external")
        assert case.modes == expected, case.id


def test_gates_name_known_capabilities() -> None:
    for case in _catalogue.CATALOGUE:
        assert set(case.gated_by) <= set(cap.ALL)
    gated = {name for case in _catalogue.CATALOGUE for name in case.gated_by}
    assert gated == set(cap.ALL)


def test_every_case_has_its_public_check_function() -> None:
    for case in _catalogue.CATALOGUE:
        assert getattr(checks, f"check_{case.label}_{case.name}") is case.check
    assert len(checks.__all__) == len(_catalogue.CATALOGUE)


def test_labels_are_in_catalogue_order_and_each_has_cases() -> None:
    assert tuple(dict.fromkeys(c.label for c in _catalogue.CATALOGUE)) == _catalogue.LABELS


def test_digest_depends_on_the_catalogue_only() -> None:
    assert _catalogue.digest() == _catalogue.digest()
    assert re.fullmatch(r"[0-9a-f]{64}", _catalogue.digest())


def test_public_api_resolves() -> None:
    for name in vz_conformance.__all__:
        assert getattr(vz_conformance, name) is not None


def test_docs_list_every_case_and_every_label_count() -> None:
    text = DOC.read_text()
    for case in _catalogue.CATALOGUE:
        assert f"`{case.id}`" in text, case.id
    for label, count in COUNTS.items():
        assert f"| {label} | {count} |" in text, label
