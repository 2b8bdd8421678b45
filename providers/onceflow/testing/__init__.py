"""Test doubles and the real-Airflow harness, shipped as product code (see docs/testing.md)."""
