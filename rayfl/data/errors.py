"""The one exception the data layer raises for missing, corrupt or unreadable files."""

from __future__ import annotations


class DatasetError(Exception):
    """A dataset cannot be read; the message names the file or directory and what to do."""
