"""Producer message stubs, the consumer message log and the de-dup table (seed 002 6.2, 6.3).

SQLite files `DIR/ledger/producer.db` / `DIR/ledger/consumer.db` by default, or one PostgreSQL
database given by URL; SQLAlchemy Core throughout.
"""
