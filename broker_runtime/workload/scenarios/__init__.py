"""One module per family of scenarios; `RUNNERS` maps a scenario name to its coroutine."""
