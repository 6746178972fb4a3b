"""The fault-injecting workload (`mqaudit workload`): producers and consumers against a
cluster, each scenario injecting one fault, and `truth.json` recording
what actually happened, so that the audit can be scored against it."""
