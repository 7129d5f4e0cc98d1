"""storage/heap.py: the C allocator keeps an upload's freed buffers for reuse (docs/decisions.md, "Uploads")."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Rounds of what a PUT does to the heap: pieces of 256 KiB made (the socket read, the parser's slice),
# held while a batch is hashed and written, then freed; the minor page faults the rounds cost.
PIECES_PROGRAM = """
import resource, sys
from contentsvc.storage.heap import reuse_freed_buffers
kept = reuse_freed_buffers() if sys.argv[1] == "reuse" else None
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    batch = [bytes(256 * 1024) for _ in range(16)]
    del batch
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(mode: str) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PIECES_PROGRAM, mode], capture_output=True, text=True, check=True)
    kept, faults = out.stdout.split()
    return kept, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_upload_buffers_are_reused_instead_of_faulted_in_again():
    kept, reused = _page_faults("reuse")
    _, default = _page_faults("default")
    assert kept == "True"
    # 50 rounds of 4 MiB: with glibc's defaults nearly every round takes fresh pages (about 1,000
    # faults each); kept, only the first round does.
    assert default > 20_000 and reused < 5_000, (default, reused)
