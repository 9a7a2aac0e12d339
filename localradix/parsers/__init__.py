"""Parsers of model output: tool calls (`tool_calls`) and reasoning (`reasoning`), plus the
grammar constraint that forces tool calls (`tool_constraint`)."""
