"""What the tests share: stand-ins for what cannot run here (``fakes``: Stripe's servers,
upstream replicas, an upstream that reports usage, a Valkey cluster, gateway processes),
the gateway as the tests run it (``gateway``), the `cstack` command (``cstack``), builders
of test data, and waits. Import it as ``tests.support.<module>``; nothing imports a
conftest."""
