"""Producer message stubs, the consumer message log and the de-dup table.

SQLite files `DIR/ledger/producer.db` / `DIR/ledger/consumer.db` by default, or one PostgreSQL
database given by URL; SQLAlchemy Core throughout.
"""
