"""Master -> slave CommitLog replication over its own TCP port (RocketMQ's HAService)."""
