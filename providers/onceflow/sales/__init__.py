"""The ``daily_sales`` domain: orders, cleaning, partitions, the atomic overwrite, fencing and audit."""
