"""Small pieces shared by every part of the broker runtime (and reused by the pipeline)."""
