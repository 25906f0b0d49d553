"""A real Redis Cluster for the tests: valkey-server nodes in cluster mode, with a password.

Three primaries split the 16384 slots; each has a replica, so that killing a primary is a
real failover (its replica is elected once ``cluster-node-timeout`` has passed).
"""

from __future__ import annotations

import secrets
import signal
import time
from urllib.parse import quote

import redis

from serving.valkey import AuthenticatedValkey

NODE_TIMEOUT_MS = 1000
RANGES = [(0, 5460), (5461, 10922), (10923, 16383)]


class ValkeyCluster:
    def __init__(self) -> None:
        self.password = secrets.token_urlsafe(16)
        self.nodes: list[AuthenticatedValkey] = []

    def start(self, timeout_s: float = 30.0) -> ValkeyCluster:
        for _ in range(2 * len(RANGES)):
            node = AuthenticatedValkey(
                self.password,
                save="",
                appendonly="no",
                masterauth=self.password,
                **{"repl-diskless-sync-delay": "0"},
                **{
                    "cluster-enabled": "yes",
                    "cluster-config-file": "nodes.conf",
                    "cluster-node-timeout": str(NODE_TIMEOUT_MS),
                },
            )
            node.start()
            self.nodes.append(node)
        clients = [self.client(i) for i in range(len(self.nodes))]
        ids = [client.execute_command("CLUSTER MYID").decode() for client in clients]
        for client, (first, last) in zip(clients, RANGES, strict=False):
            client.execute_command("CLUSTER ADDSLOTSRANGE", first, last)
        for node in self.nodes[1:]:
            clients[0].execute_command("CLUSTER MEET", "127.0.0.1", node.port)
        deadline = time.monotonic() + timeout_s
        while not all(len(c.execute_command("CLUSTER NODES")) == len(clients) for c in clients):
            assert time.monotonic() < deadline, "the cluster's nodes never all met"
            time.sleep(0.05)
        for replica, primary_id in zip(clients[len(RANGES) :], ids[: len(RANGES)], strict=True):
            replica.execute_command("CLUSTER REPLICATE", primary_id)
        for replica in clients[len(RANGES) :]:  # in sync: a replica never synced fails none over
            while replica.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline, "a replica never synced with its primary"
                time.sleep(0.05)
        self.wait_ok(deadline)
        for client in clients:
            client.close()
        return self

    def client(self, index: int) -> redis.Redis:
        return redis.Redis(port=self.nodes[index].port, password=self.password)

    @property
    def url(self) -> str:
        """The product's URL for it: two seed nodes, the password."""
        seeds = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes[:2])
        return f"redis-cluster://:{quote(self.password, safe='')}@{seeds}"

    def wait_ok(self, deadline: float) -> None:
        """Until every live node says the cluster is ok and every slot has a live primary
        with a replica in sync (or none left)."""
        while True:
            states = []
            for index, node in enumerate(self.nodes):
                if node.is_running():
                    with self.client(index) as client:
                        states.append(client.execute_command("CLUSTER INFO")["cluster_state"])
            if all(state == "ok" for state in states):
                return
            assert time.monotonic() < deadline, f"cluster not ok: {states}"
            time.sleep(0.05)

    def primary_of(self, key: str) -> int:
        """The index of the node that is primary for ``key``'s slot now."""
        for index, node in enumerate(self.nodes):
            if not node.is_running():
                continue
            with self.client(index) as client:
                slot = client.execute_command("CLUSTER KEYSLOT", key)
                for shard in client.execute_command("CLUSTER SHARDS"):
                    ranges = shard[b"slots"]  # first, last, first, last, ...
                    if any(a <= slot <= b for a, b in zip(ranges[::2], ranges[1::2], strict=True)):
                        for member in shard[b"nodes"]:
                            if member[b"role"] == b"master" and member[b"health"] == b"online":
                                port = int(member[b"port"])
                                return next(i for i, n in enumerate(self.nodes) if n.port == port)
        raise AssertionError(f"no live primary for {key}")

    def kill(self, index: int) -> None:
        """SIGKILL a node: no goodbye to its peers, its unreplicated writes gone."""
        process = self.nodes[index]._process
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def wait_failover(self, key: str, timeout_s: float = 30.0) -> int:
        """Until a live replica has taken over ``key``'s slot; the new primary's index."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                index = self.primary_of(key)
                if self.nodes[index].is_running():
                    self.wait_ok(deadline)
                    return index
            except AssertionError:
                pass
            assert time.monotonic() < deadline, "no replica took over"
            time.sleep(0.1)

    def stop(self) -> None:
        for node in self.nodes:
            try:
                node.stop()
            except Exception:  # a killed node: nothing left to stop
                node.terminate()
