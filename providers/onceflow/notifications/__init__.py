"""Notifiers and deadline references: the ``daily_sales`` Deadline Alert and what it tells."""
