"""decisions-part2 "Startup configuration", `launch`: `contentsvc run` starts `plugin serve NAME
--port <endpoint port>` for each pin that asks for it, with the pin's token and no other."""

from __future__ import annotations

from pathlib import Path

from contentsvc.config.environment import PLUGIN_TOKEN_VARIABLE
from contentsvc.config.settings import PluginSettings
from contentsvc.processes.supervisor import launched_plugins


def _pin(endpoint: str, launch: str | None, token: str | None = None) -> PluginSettings:
    return PluginSettings(endpoint=endpoint, version="0.1.0", manifest=Path("pdf/contentsvc-plugin.json"),
                          token=token, launch=launch)


def test_a_launch_pin_becomes_a_plugin_serve_child_on_its_endpoint_port_with_its_token():
    env = {"PATH": "/bin", PLUGIN_TOKEN_VARIABLE: "the-supervisor's-own"}
    children = launched_plugins({"pdf": _pin("http://127.0.0.1:9101", "pdf", token="s3cret"),
                                 "query": _pin("http://127.0.0.1:9102", "query"),
                                 "rss": _pin("http://127.0.0.1:9103", None)}, env)
    assert set(children) == {"plugin:pdf", "plugin:query"}  # a pin without launch is the operator's to run
    args, pdf_env = children["plugin:pdf"]
    assert args == ["plugin", "serve", "pdf", "--host", "127.0.0.1", "--port", "9101"]
    assert pdf_env[PLUGIN_TOKEN_VARIABLE] == "s3cret" and pdf_env["PATH"] == "/bin"
    # a pin without a token: the plugin runs without one, never with a token inherited from elsewhere
    assert PLUGIN_TOKEN_VARIABLE not in children["plugin:query"][1]
    assert env[PLUGIN_TOKEN_VARIABLE] == "the-supervisor's-own"  # the shared environment is left alone
