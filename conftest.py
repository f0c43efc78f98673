"""pytest's entry at the repository root: the shared fixtures and hooks of every test folder, in tests/fixtures.py."""

pytest_plugins = ["tests.fixtures"]
