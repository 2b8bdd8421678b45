"""The Sheet queue's domain, with no Airflow imports: rows, validation, the claim protocol, anchors, reconcile, transport."""
