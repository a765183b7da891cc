"""Processing: user code run on each record, in-process or in a sidecar container."""
