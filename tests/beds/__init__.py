"""Developer tools: a tiny local mirror of the paper assets and its loopback server."""
