"""The agent tool server: `contentsvc mcp --profile read|ingest` over stdio."""
