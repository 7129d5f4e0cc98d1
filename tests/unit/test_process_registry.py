"""The process registry is the one list of process kinds: the CLI, the supervisor and
compose.yaml follow it."""

from pathlib import Path

import pytest
import yaml

from contentsvc.cli import build_parser
from contentsvc.config import load_settings
from contentsvc.processes.registry import API, PROCESSES, PROJECTOR, WORKER, of_role
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
