"""Consumer offsets and other small broker state kept as JSON."""
