"""The client over mutual TLS, against the second replica run_tests.sh starts with
`--tls-cert/--tls-key/--tls-client-ca` (the throwaway certificates in tests/fixtures/tls:
a CA, a server certificate for localhost / 127.0.0.1, a client certificate).
"""
import os

import pytest

from prefixlog_client import IndexClient

from test_live import KS, full_chain_answer, last_chain

ADDR = os.environ.get("PREFIXLOG_GRPC_TLS")
TLS_DIR = os.environ.get("PREFIXLOG_TLS_DIR")
pytestmark = pytest.mark.skipif(
    not (ADDR and TLS_DIR), reason="PREFIXLOG_GRPC_TLS / PREFIXLOG_TLS_DIR not set (run python/run_tests.sh)"
)


def pem(name):
    with open(os.path.join(TLS_DIR, name), "rb") as f:
        return f.read()


def test_mutual_tls_scores_like_the_plaintext_replica():
    c = IndexClient(
        [ADDR],
        deadline=5.0,
        root_certificates=pem("ca.pem"),
        private_key=pem("client.key"),
        certificate_chain=pem("client.pem"),
    )
    r = full_chain_answer(c, last_chain())
    assert r.replica_id == "py-tls"
    c.close()


def test_without_a_client_certificate_or_without_tls_it_fails_open():
    chain = last_chain()
    # Server verified, but no client certificate: the handshake is refused (mTLS).
    no_cert = IndexClient([ADDR], deadline=2.0, root_certificates=pem("ca.pem"))
    r = no_cert.match(KS, hashes=chain)
    assert r.outcome == "unavailable" and r.reason, r
    no_cert.close()
    # Plaintext to a TLS port: never an exception, an "unavailable" outcome.
    plain = IndexClient([ADDR], deadline=2.0)
    r = plain.match(KS, hashes=chain)
    assert r.outcome == "unavailable", r
    plain.close()


def test_half_configured_mutual_tls_is_refused_up_front():
    with pytest.raises(ValueError):
        IndexClient([ADDR], root_certificates=pem("ca.pem"), private_key=pem("client.key"))
