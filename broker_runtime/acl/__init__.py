"""Access control: HMAC-signed requests and per-topic/group permissions (RocketMQ's plain ACL)."""
