"""Speculation: candidate trees, selection, verification and the policies built on them."""
