"""The package's version, in one place: pyproject.toml reads it, the CLI and the manifest import it."""

__version__ = "0.1.0"
