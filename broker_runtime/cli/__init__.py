"""The `mqaudit` command line."""
