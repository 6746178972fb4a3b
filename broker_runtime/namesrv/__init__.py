"""Name servers: the topic route registry brokers register with (RocketMQ's namesrv)."""
