"""Thin operators over the hooks: sheets, ledger, partition loads, the dashboard, the article chain's steps."""
