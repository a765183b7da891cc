"""``kubectl offtake``: operate ConsumerPipelines from the terminal (a kubectl plugin).

Talks to the API server with the user's own kubeconfig, context and namespace (so their RBAC
applies) and to Kafka directly, read-only, for what only the brokers know (per-partition
positions, group members, dead letters). Changes go through the pipeline's spec, never around
the operator.
"""
