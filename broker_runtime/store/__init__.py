"""The broker store: CommitLog, ConsumeQueue, IndexFile, checkpoint and recovery."""
