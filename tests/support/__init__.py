"""What the tests share: stand-ins for what cannot run here (``fakes``: Stripe's servers,
an upstream that reports usage, upstream replicas, a Valkey cluster), real gateway
processes with billing's meter (``gateway_processes``, ``metered_gateway``), the gateway as
the tests run it (``gateway``), billing's test price books and processes (``billing``),
builders of test data (``builders``), the launch week's traffic and its invoice by hand
(``launch_traffic``), the `cstack` command (``commands``), and waits. Import it as
``tests.support.<module>``; nothing imports a conftest."""
