"""Which process of a deployment a command line is, by the name the supervisor and the log lines
give it (`api`, `projector:lexical`, `worker:gc`, `plugin:pdf`), and the live children of a
`contentsvc run` by that name: for operators' tools, the benchmarks and the tests alike.
"""

from __future__ import annotations

from pathlib import Path

import psutil

from contentsvc.processes.registry import API

SUPERVISOR = "supervisor"


def role_of(argv: list[str]) -> str | None:
    """`supervisor` for `contentsvc run`, `api` for `serve`, `projector:NAME`, `worker:NAME` and
    `plugin:NAME` for `projector run NAME`, `worker run NAME` and `plugin serve NAME`: the words
    after `contentsvc.cli` (`python -m contentsvc.cli ...`, as the supervisor starts each child) or
    after the `contentsvc` script. None for any other command line."""
    start = next((i for i, word in enumerate(argv) if word == "contentsvc.cli" or Path(word).name == "contentsvc"),
                 None)
    if start is None:
        return None
    words = [w for w in argv[start + 1:] if not w.startswith("-")]
    if not words or words[0] == "run":
        return SUPERVISOR
    if words[0] == "serve":
        return API
    if len(words) >= 3 and words[1] in ("run", "serve"):
        return f"{words[0]}:{words[2]}"
    return None


def supervised_children(supervisor_pid: int) -> dict[str, psutil.Process]:
    """The live children of the `contentsvc run` with that pid, by role_of (exited ones, zombies
    included, are left out)."""
    children: dict[str, psutil.Process] = {}
    for child in psutil.Process(supervisor_pid).children():
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            role = role_of(child.cmdline())
        except psutil.Error:
            continue  # ended meanwhile
        if role is not None:
            children[role] = child
    return children
