"""RabbitMQ: ledger hooks for pika clients, topology snapshots and routing as the broker does it."""
