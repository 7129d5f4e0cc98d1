"""`projector_checkpoints` is written in one module (contentsvc.journal.checkpoints):
every other module moves a checkpoint through it, so the rules for moving one live once."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWNER = ROOT / "src" / "contentsvc" / "journal" / "checkpoints.py"
WRITE = re.compile(r"\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM|TRUNCATE(\s+TABLE)?)\s+projector_checkpoints\b", re.I)


def test_only_the_checkpoints_module_writes_the_table():
    sources = [p for folder in ("src", "projectors", "bench") for p in (ROOT / folder).rglob("*.py")]
    assert OWNER in sources
    writers = sorted(str(p.relative_to(ROOT)) for p in sources if p != OWNER and WRITE.search(p.read_text()))
    assert writers == []
    assert WRITE.search(OWNER.read_text())  # the pattern does find a writer
