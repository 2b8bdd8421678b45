"""Sensors: ``NewRowsSensor``, deferrable, waits for NEW rows of the Sheet queue."""
