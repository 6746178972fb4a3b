"""HTML reports over the audit tables: the audit report and the dead-letter report."""
