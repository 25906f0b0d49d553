"""Running the gateway app: its listeners and their HTTP/1.1 limits, the ASGI middleware,
and the supervisor and worker processes of ``cstack gateway --workers N``."""
