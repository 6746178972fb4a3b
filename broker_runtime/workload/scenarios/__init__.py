"""The scenarios, one module per family; runner.py maps each name to its coroutine."""
