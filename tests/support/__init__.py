"""Helpers shared by the test suites (importable as ``support``: tests/ is on sys.path)."""
