"""First-party plugins, each a separate process speaking the plugin protocol: `contentsvc plugin serve NAME`."""
