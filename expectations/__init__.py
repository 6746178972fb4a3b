"""Great Expectations suites for the lakehouse tables (later issues)."""
