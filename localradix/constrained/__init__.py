"""Grammar-constrained decoding (xgrammar): compiled off the engine loop, applied as bitmasks."""
