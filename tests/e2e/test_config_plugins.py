"""`[plugins.<id>]` through the command line (decisions-part2, "Startup configuration":
exit 2 and one line naming the TOML key path; `config check` prints tokens as "***")."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

from tests.e2e.test_config import cli

PDF_MANIFEST = Path(__file__).resolve().parents[2] / "src" / "contentsvc_plugins" / "pdf" / "contentsvc-plugin.json"


def test_config_check_pins_plugins_and_names_the_key_it_refuses(tmp_path):
    deploy = tmp_path / "deploy"
    (deploy / "pdf").mkdir(parents=True)
    shutil.copy(PDF_MANIFEST, deploy / "pdf")
    config = deploy / "contentsvc.toml"
    config.write_text('[plugins.pdf]\nendpoint = "http://127.0.0.1:8095"\nversion = "0.1.0"\n'
                      'manifest = "pdf/contentsvc-plugin.json"\ntoken = "env:PDF_TOKEN"\n')
    out = cli(tmp_path, "config", "check", "--config", str(config), PDF_TOKEN="plugin-secret-77")
    assert out.returncode == 0, out.stderr
    assert "plugin-secret-77" not in out.stdout
    printed = tomllib.loads(out.stdout)["plugins"]["pdf"]
    assert printed["token"] == "***"
    assert printed["manifest"] == str(deploy / "pdf" / "contentsvc-plugin.json")

    config.write_text(config.read_text().replace('version = "0.1.0"', 'version = "0.9.0"'))
    out = cli(tmp_path, "serve", "--config", str(config), PDF_TOKEN="plugin-secret-77")
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "configuration error: plugins.pdf.version: must equal the manifest's version '0.1.0'"]
