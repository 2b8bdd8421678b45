"""pytest fixtures for sales; registered by onceflow.testing.pytest_plugin."""

from __future__ import annotations
