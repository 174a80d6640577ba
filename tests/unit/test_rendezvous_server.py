"""Horovod patch 0012, on horovodrun's own rendezvous server (a real HTTP server on loopback, no workers): after
every rank has finished a rendezvous, that scope's addresses are gone, whatever order the ranks' DELETEs of the other
scopes came in. Before the patch, a one-rank ``cross_<i>`` scope that finished between the two ranks' ``local``
DELETEs wiped every scope's list of finished ranks, so ``local_<host>`` kept the addresses of the last init and a
re-initialised worker could connect to its peer's old, closed port (a SIGABRT in Gloo inside ``hvd.init``)."""
import urllib.error
import urllib.request

import pytest

http_server = pytest.importorskip("horovod.runner.http.http_server")
hosts = pytest.importorskip("horovod.runner.common.util.hosts")


@pytest.fixture
def server():
    srv = http_server.RendezvousServer()
    port = srv.start()
    srv.init(hosts.get_host_assignments(hosts.parse_hosts("localhost:2"), 2))  # 2 ranks on one host

    def request(method, path, body=None):
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as answer:
                return answer.status
        except urllib.error.HTTPError as e:
            return e.code

    yield request
    srv.stop()


def _publish(request):
    """What one init writes: each rank's address in the global and local scopes, and its one-rank cross scope."""
    for scope in ("global", "local_localhost"):
        for rank in (0, 1):
            assert request("PUT", f"/{scope}/{rank}", f"address of rank {rank}".encode()) == 200
    assert request("PUT", "/cross_0/0", b"x") == 200 and request("PUT", "/cross_1/1", b"y") == 200


@pytest.mark.parametrize("order", [
    # the order in which the server's request log showed it before each abort: rank 0 finished its local and its
    # cross rendezvous before rank 1's local DELETE arrived
    ["/global/0", "/global/1", "/local_localhost/0", "/cross_0/0", "/local_localhost/1", "/cross_1/1"],
    # and the order that always worked
    ["/global/0", "/global/1", "/local_localhost/0", "/local_localhost/1", "/cross_0/0", "/cross_1/1"],
])
def test_every_finished_scope_forgets_its_addresses(server, order):
    _publish(server)
    assert server("GET", "/local_localhost/0") == 200              # published: the test reads what it means to
    for path in order:
        server("DELETE", path)
    for path in ("/global/0", "/global/1", "/local_localhost/0", "/local_localhost/1", "/cross_0/0", "/cross_1/1"):
        assert server("GET", path) == 404, path                     # the next init reads only new addresses
