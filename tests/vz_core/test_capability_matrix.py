from __future__ import annotations

from pathlib import Path

from vz_core import capability_matrix as cm

DOC = Path(__file__).resolve().parents[2] / "docs" / "capability-matrix.md"


def test_doc_table_matches_the_data() -> None:
    text = DOC.read_text()
    table = text.split("<!-- matrix:start -->\n", 1)[1].split("<!-- matrix:end -->", 1)[0]
    assert table == cm.render_markdown(), "run: python -m vz_core.capability_matrix and paste into the doc"


def test_each_triple_is_listed_once() -> None:
    triples = [(e.driver, e.host_os, e.target_os) for e in cm.MATRIX]
    assert len(triples) == len(set(triples))


def test_lookup() -> None:
    entry = cm.lookup("qemu", "linux", "linux")
    assert entry is not None and entry.status in ("ACTIVE", "DEV")
    assert cm.lookup("qemu", "linux", "windows") is None
    assert cm.current_host_os() == "linux"
