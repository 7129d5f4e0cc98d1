"""No module outside contentsvc/config reads the environment: settings come from
the one configuration, loaded once (issue: "One configuration")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "src" / "contentsvc", ROOT / "projectors", ROOT / "bench"]
CONFIG = ROOT / "src" / "contentsvc" / "config"
# Setting a variable for this process's libraries or for a child is a write, not a read.
WRITES = {"setdefault", "update", "pop", "clear"}


def _environment_reads(tree: ast.AST) -> list[int]:
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os" and any(
                alias.name in ("environ", "environb", "getenv", "getenvb") for alias in node.names):
            lines.append(node.lineno)
        if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"):
            continue
        if node.attr in ("getenv", "getenvb", "environb"):
            lines.append(node.lineno)
        elif node.attr == "environ":
            parent = parents.get(node)
            written = (isinstance(parent, ast.Attribute) and parent.attr in WRITES
                       and isinstance(parents.get(parent), ast.Call)) or (
                isinstance(parent, ast.Subscript) and isinstance(parent.ctx, (ast.Store, ast.Del)))
            if not written:
                lines.append(node.lineno)
    return lines


def test_only_the_configuration_reads_the_environment():
    offenders = []
    for folder in SOURCES:
        for path in sorted(folder.rglob("*.py")):
            if CONFIG in path.parents:
                continue
            for line in _environment_reads(ast.parse(path.read_text(), str(path))):
                offenders.append(f"{path.relative_to(ROOT)}:{line}")
    assert not offenders, "read the environment outside contentsvc/config: " + ", ".join(offenders)


def test_the_check_sees_reads_and_allows_writes():
    reads = ("import os\nos.environ.get('X')\n", "import os\nos.getenv('X')\n", "import os\nv = os.environ['X']\n",
             "import os\nenv = dict(os.environ)\n", "from os import environ\n", "import os\nenv = {**os.environ}\n")
    for source in reads:
        assert _environment_reads(ast.parse(source)), source
    writes = ("import os\nos.environ['X'] = '1'\n", "import os\nos.environ.setdefault('X', '1')\n",
              "import os\ndel os.environ['X']\n")
    for source in writes:
        assert not _environment_reads(ast.parse(source)), source
