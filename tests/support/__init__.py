"""What the tests share: stand-ins for what cannot run here (``fakes``: Stripe's servers,
an upstream that reports usage, a Valkey cluster, gateway processes), builders of test
data, and waits. Import it as ``tests.support.<module>``; nothing imports a conftest."""
