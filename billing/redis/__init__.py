"""Redis plumbing with no notion of money: clients from the one Redis URL, the pipelined
connection, batched script calls, Redis Cluster routing."""
