"""Plugins Hoist ships as examples of its extension points (entry points in pyproject.toml)."""
