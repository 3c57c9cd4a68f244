"""Test configuration: fixtures come from the ``tests.fix_*`` plugins (see pyproject addopts)."""
