"""The package version, in one place the daemons can import without the client SDK."""

__version__ = "0.1.0"
