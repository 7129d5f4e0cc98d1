"""The process registry is the one list of process kinds: the CLI, the supervisor and
compose.yaml follow it."""

from pathlib import Path

import pytest
import yaml

from contentsvc.cli import build_parser
from contentsvc.config import load_settings
from contentsvc.processes.children import role_of
from contentsvc.processes.registry import API, PROCESSES, PROJECTOR, WORKER, of_role
from contentsvc.processes.supervisor import supervisor_label
from contentsvc.projectors.base import Projector

ROOT = Path(__file__).resolve().parents[2]


def cli(*argv: str) -> int:
    """The command as `contentsvc` runs it (without configuring the process's logging)."""
    args = build_parser().parse_args(argv)
    return args.func(args, load_settings())


def test_names_are_unique_and_every_fold_resolves_to_a_projector():
    assert len({kind.name for kind in PROCESSES}) == len(PROCESSES)
    assert [kind.name for kind in PROCESSES if kind.role == API] == ["api"]
    for kind in PROCESSES:
        assert kind.role in (API, PROJECTOR, WORKER)
        if kind.role == API:
            continue
        module, cls = kind.factory.split(":")
        fold = getattr(__import__(module, fromlist=[cls]), cls)
        assert issubclass(fold, Projector) and fold.name == kind.name


def test_compose_runs_one_service_per_process_kind():
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    assert set(services) == {"postgres", "migrate"} | {kind.name for kind in PROCESSES}
    for kind in PROCESSES:
        assert services[kind.name]["command"] == ["contentsvc", *kind.command]


def test_projector_list_prints_the_registry(capsys):
    assert cli("projector", "list") == 0
    assert capsys.readouterr().out.split() == list(of_role(PROJECTOR))


@pytest.mark.parametrize("role", [PROJECTOR, WORKER])
def test_an_unknown_name_exits_2_naming_the_known_ones(role, capsys):
    assert cli(role, "run", "no-such-process") == 2
    err = capsys.readouterr().err
    assert "no-such-process" in err and all(name in err for name in of_role(role))


def test_each_childs_command_line_names_it_as_the_supervisor_does():
    """processes/children.role_of: the tests and the benchmarks find a child by the name its log
    lines carry (the supervisor's label), read back from the command line it was started with."""
    python = ["/usr/bin/python3", "-m", "contentsvc.cli"]
    for kind in PROCESSES:
        command = python + kind.command + (["--host", "127.0.0.1", "--port", "8080"] if kind.role == API else [])
        assert role_of(command) == supervisor_label(kind)
    assert role_of(python + ["run", "--port", "8080"]) == "supervisor"
    assert role_of(["/usr/bin/python3", "/usr/local/bin/contentsvc", "plugin", "serve", "pdf", "--port", "9101"]) \
        == "plugin:pdf"
    # An operator's command, and any other program, is no process of a deployment.
    assert role_of(["/usr/local/bin/contentsvc", "projector", "replay", "lexical"]) is None
    assert role_of(["/usr/local/bin/contentsvc", "keys", "create", "--org", "acme"]) is None
    assert role_of(["/usr/lib/postgresql/15/bin/postgres", "-D", "/data"]) is None
