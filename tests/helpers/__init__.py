"""Programs the tests run as subprocesses (not collected as tests)."""
