"""Triggers: ``NewRowsTrigger``, which waits for NEW rows on the triggerer."""
