"""The audit lakehouse: PySpark jobs over the broker files and ledgers."""
