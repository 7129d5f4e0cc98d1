"""The distribution as a user gets it: the wheel's file list, and a non-editable install
that migrates a database from a directory that is not the checkout.

An editable install would hide both failures this guards against: top-level folders
(projectors/, bench/, schema/) that land at the top of site-packages, and migrations
that are only found through the checkout's paths (`applied 0 migration(s)` elsewhere).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from contentsvc.processes.local_service import create_database, drop_database

CHECKOUT = Path(__file__).resolve().parents[2]
# What the build reads: the project files and the folders pyproject.toml maps into the package.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "src", "projectors", "bench", "schema")
BUILD_LEFTOVERS = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.log")


def folder_files(folder: str, suffix: str) -> set[str]:
    return {p.name for p in (CHECKOUT / folder).glob(f"*{suffix}")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the sources: an in-place build would reuse the checkout's build/
    folder, where files deleted since the last build still lie and would ship."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    for name in SOURCES:
        path = CHECKOUT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=BUILD_LEFTOVERS)
        else:
            shutil.copy2(path, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(root / "dist"),
                            str(source)], capture_output=True, text=True, timeout=240)
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = (root / "dist").glob("contentsvc-*.whl")
    return path


def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def in_package(names: set[str], folder: str, suffix: str) -> set[str]:
    prefix = f"contentsvc/{folder}/"
    return {n[len(prefix):] for n in names if n.startswith(prefix) and "/" not in n[len(prefix):] and n.endswith(suffix)}


def test_wheel_ships_every_folder_inside_the_namespace(wheel):
    names = wheel_names(wheel)
    migrations = folder_files("schema", ".sql")
    assert migrations, "the checkout has no migrations"
    assert in_package(names, "schema", ".sql") == migrations
    assert in_package(names, "projectors", ".py") == folder_files("projectors", ".py")
    assert in_package(names, "bench", ".py") == folder_files("bench", ".py")

    # The plugin manifest meta-schema, and each first-party plugin's manifest and fixtures
    # (decisions-part2: `contentsvc plugin check` and discovery read them from the package).
    assert "contentsvc/plugins/manifest.schema.json" in names
    plugins = CHECKOUT / "src" / "contentsvc_plugins"
    shipped = {p.relative_to(CHECKOUT / "src").as_posix() for p in plugins.glob("*/contentsvc-plugin.json")}
    shipped |= {p.relative_to(CHECKOUT / "src").as_posix() for p in plugins.glob("*/fixtures/*") if p.is_file()}
    assert "contentsvc_plugins/pdf/contentsvc-plugin.json" in shipped
    assert "contentsvc_plugins/pdf/fixtures/inspection.pdf" in shipped
    for plugin in ("query", "rss", "social_list"):  # decisions-part2: every first-party plugin's folder
        assert f"contentsvc_plugins/{plugin}/contentsvc-plugin.json" in shipped
        assert f"contentsvc_plugins/{plugin}/plugin.py" in names
    assert "contentsvc_plugins/rss/fixtures/rss.json" in shipped
    assert "contentsvc_plugins/social_list/fixtures/list_timeline.json" in shipped
    assert shipped <= names, sorted(shipped - names)

    dist_info = next(n.split("/", 1)[0] for n in names if ".dist-info/" in n)
    top_level = {n.split("/", 1)[0] for n in names}
    # Only the project's own names land at the top of site-packages (contentsvc, and
    # contentsvc_plugins for the first-party plugin processes), nothing generic.
    assert not top_level & {"projectors", "bench", "schema", "tests", "src"}
    assert all(name == "contentsvc" or name.startswith("contentsvc_") for name in top_level - {dist_info}), top_level
    with zipfile.ZipFile(wheel) as archive:
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
    assert "[console_scripts]" in entry_points
    assert "contentsvc = contentsvc.cli:main" in entry_points


@pytest.fixture
def installed(wheel, tmp_path) -> Path:
    """A fresh virtualenv with the wheel installed, not editable. It sees the system
    packages for the dependencies (psycopg and the rest are installed there, and fetching
    them would be slow); the wheel's own copy of contentsvc must win over any system one."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
                   check=True, timeout=60)
    python = venv / "bin" / "python"
    # The system's pip (seen through the system packages) installs into the venv it runs in;
    # --ignore-installed: a system contentsvc of the same version must not count as installed.
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--ignore-installed",
                           str(wheel)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return venv


def outside_checkout_env(database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CONTENTSVC_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, "CONTENTSVC_DATABASE_URL": database_url}


def test_installed_contentsvc_migrates_from_an_empty_directory(installed, admin_url, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    database_url = create_database(admin_url, "cspkg")
    try:
        env = outside_checkout_env(database_url)
        where = subprocess.run([str(installed / "bin" / "python"), "-c", "import contentsvc; print(contentsvc.__file__)"],
                               cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60)
        assert where.returncode == 0, where.stderr
        loaded_from = Path(where.stdout.strip())
        assert loaded_from.is_relative_to(installed), f"contentsvc loaded from {loaded_from}, not from the venv"

        migrated = subprocess.run([str(installed / "bin" / "contentsvc"), "migrate"], cwd=elsewhere, env=env,
                                  capture_output=True, text=True, timeout=120)
    finally:
        drop_database(admin_url, database_url)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    every_migration = len(folder_files("schema", ".sql"))  # 9 today
    assert f"applied {every_migration} migration(s)" in migrated.stdout, migrated.stdout + migrated.stderr
