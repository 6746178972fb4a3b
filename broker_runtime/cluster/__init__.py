"""Running nodes as processes: a node's own lifecycle, and the supervisor of a whole cluster."""
