"""The local cluster daskfeed starts speaks TLS with credentials of its own: a client without
them is refused, by the scheduler and by every nanny and worker; daskfeed's own clients work."""

from __future__ import annotations

import pickle
import socket
import ssl

import pytest

from daskfeed.cluster._budget import Budget
from daskfeed.cluster._start import close_client, start_local_cluster


@pytest.fixture(scope="module")
def tls_client():
    """A client of a real local cluster of 2 worker processes, started as daskfeed starts it."""
    client = start_local_cluster(Budget.split("3GB", nworkers=2), dashboard_address="127.0.0.1:0")
    try:
        client.wait_for_workers(2, timeout=120)
        yield client
    finally:
        close_client(client)


def _listeners(client) -> list[str]:
    """Every comm address of the cluster: the scheduler, each worker and each nanny."""
    info = client.scheduler_info(n_workers=-1)["workers"]
    return [client.scheduler.address, *info, *(w["nanny"] for w in info.values() if w.get("nanny"))]


def _refused_at_the_tls_layer(address: str, cert: tuple[str, str] | None) -> str:
    """Speak TLS to ``address`` trusting any server, presenting ``cert`` (or none); what failed.

    The server asks for a certificate signed by its own CA: without one (or with another) the
    handshake fails, or (TLS 1.3: the client's certificate is checked after the client's side
    of the handshake is done) the first read gets the server's alert or the closed connection.
    """
    host, port = address.split("://")[1].rsplit(":", 1)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if cert is not None:
        ctx.load_cert_chain(*cert)
    with socket.create_connection((host, int(port)), timeout=30) as raw:
        try:
            with ctx.wrap_socket(raw) as tls:
                tls.sendall(b"\x00" * 64)
                data = tls.recv(1)
        except (ssl.SSLError, ConnectionError) as err:
            return type(err).__name__
    assert data == b"", f"{address} answered a client without its credentials: {data!r}"
    return "closed"


def test_the_scheduler_workers_and_nannies_speak_tls_and_the_trainers_client_works(tls_client):
    addresses = _listeners(tls_client)
    assert len(addresses) == 5, addresses  # scheduler, 2 workers, 2 nannies
    assert all(a.startswith("tls://127.0.0.1:") for a in addresses), addresses
    assert tls_client.submit(sum, [1, 2], pure=False).result(timeout=60) == 3
    # the dashboard, /metrics and daskfeed's page stay HTTP on loopback, as the run prints them
    import urllib.request

    from daskfeed.dashboard import install

    links = install(tls_client)
    assert links is not None
    for url in (links.dashboard, links.page, links.status, links.metrics):
        assert url.startswith("http://127.0.0.1:"), url
        with urllib.request.urlopen(url, timeout=30) as r:
            assert r.status == 200, url
    with urllib.request.urlopen(links.metrics, timeout=30) as r:
        assert b"daskfeed_" in r.read()


def test_a_client_without_the_clusters_credentials_is_refused(tls_client, tmp_path):
    from distributed import Client, Security
    from distributed.comm import connect

    from daskfeed.cluster._remote import connect as daskfeed_connect
    from daskfeed.core import ClusterError

    address = tls_client.scheduler.address
    # another user's client: credentials of its own (a key and certificate it made)
    stranger = Security.temporary()
    with pytest.raises((OSError, TimeoutError)):
        Client(address, security=stranger, timeout="10s", set_as_default=False)
    # plain tcp:// to the same port: the scheduler speaks TLS only
    with pytest.raises((OSError, TimeoutError)):
        Client(address.replace("tls://", "tcp://", 1), timeout="10s", set_as_default=False)
    # daskfeed's own connect without credentials says what is missing
    with pytest.raises(ClusterError, match="speaks TLS"):
        daskfeed_connect(address)
    # every listener, not only the scheduler: a client that trusts any server and shows no
    # certificate, or its own, gets no answer
    key, crt = tmp_path / "stranger.key", tmp_path / "stranger.crt"
    key.write_text(stranger.tls_client_key)
    crt.write_text(stranger.tls_client_cert)
    for where in _listeners(tls_client):
        assert _refused_at_the_tls_layer(where, None)
        assert _refused_at_the_tls_layer(where, (str(crt), str(key)))
    # ... while the same raw path with the cluster's own credentials is answered
    import asyncio

    async def identity() -> dict:
        comm = await connect(address, timeout=30,
                             **tls_client.security.get_connection_args("client"))
        try:
            await comm.write({"op": "identity"})
            return await comm.read()
        finally:
            await comm.close()

    assert asyncio.run(identity())["type"] == "Scheduler"


def test_a_pickled_stream_reconnects_with_the_clusters_credentials(tls_client, id_data):
    """The second client daskfeed opens itself: a copy of a stream in another process."""
    from daskfeed.batches import BatchStream, DataSettings, Prepared

    prepared = Prepared(id_data.train_glob, client=tls_client, settings=DataSettings.resolve(
        label="cleared", batch_size=500, features=["row_id"]))
    stream = BatchStream(prepared, window_rows=2000)
    try:
        copy = pickle.loads(pickle.dumps(stream))
        try:
            x, _ = copy.batch(0)
            assert len(x["row_id"]) == 500
            assert copy.client is not tls_client
            assert copy.client.scheduler.address == tls_client.scheduler.address
        finally:
            copy.close()
    finally:
        stream.close()


def test_local_tls_false_starts_the_plain_tcp_cluster_any_local_client_reaches():
    import dask.config
    from distributed import Client

    with dask.config.set({"daskfeed.local-tls": "false"}):  # as DASK_DASKFEED__LOCAL_TLS=false
        client = start_local_cluster(Budget.split("3GB", nworkers=1), dashboard_address="")
    try:
        address = client.scheduler.address
        assert address.startswith("tcp://127.0.0.1:"), address
        with Client(address, timeout="30s", set_as_default=False) as other:
            assert other.submit(sum, [2, 3], pure=False).result(timeout=60) == 5
    finally:
        close_client(client)


def test_a_local_tls_setting_that_is_not_true_or_false_is_refused_before_a_cluster_starts():
    import dask.config

    from daskfeed.cluster import ClusterSpec
    from daskfeed.core import SettingError

    with dask.config.set({"daskfeed.local-tls": "maybe"}):
        with pytest.raises(SettingError, match=r"daskfeed.local-tls to be true or false\. "
                                               r"Received: 'maybe'\.\nHint: "):
            ClusterSpec.resolve()
        with pytest.raises(SettingError, match="Received: 'maybe'"):
            start_local_cluster(Budget.split("3GB", nworkers=1), dashboard_address="")
    assert ClusterSpec.resolve().local_tls is True  # the shipped default
    assert ClusterSpec.resolve(local_tls=False).local_tls is False  # a keyword beats the config
