"""mcp-knecht: a gated MCP server for CI data and application databases."""

__version__ = "0.1.0"
