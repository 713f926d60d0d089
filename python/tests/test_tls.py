"""Both clients over mutual TLS, against the second replica run_tests.sh starts with
`--tls-cert/--tls-key/--tls-client-ca` (the throwaway certificates in tests/fixtures/tls:
a CA, a server certificate for localhost / 127.0.0.1, a client certificate). It reads the same
log as the plaintext replica of test_live.
"""
import os

import grpc
import pytest

from test_live import ADDR as PLAIN_ADDR
from test_live import KS, full_chain_answer, last_chain, serves_next_offset_tokens

ADDR = os.environ.get("PREFIXLOG_GRPC_TLS")
TLS_DIR = os.environ.get("PREFIXLOG_TLS_DIR")
pytestmark = pytest.mark.skipif(
    not (ADDR and TLS_DIR), reason="PREFIXLOG_GRPC_TLS / PREFIXLOG_TLS_DIR not set (run python/run_tests.sh)"
)


def pem(name):
    with open(os.path.join(TLS_DIR, name), "rb") as f:
        return f.read()


def mtls(client_factory, deadline):
    return client_factory(
        [ADDR],
        deadline=deadline,
        root_certificates=pem("ca.pem"),
        private_key=pem("client.key"),
        certificate_chain=pem("client.pem"),
    )


def test_mutual_tls_scores_like_the_plaintext_replica(client_factory):
    r = full_chain_answer(mtls(client_factory, 5.0), last_chain())
    assert r.replica_id == "py-tls" and r.endpoint == ADDR


def test_one_replicas_applied_is_a_token_for_another(client_factory):
    creds = grpc.ssl_channel_credentials(pem("ca.pem"), pem("client.key"), pem("client.pem"))
    if not serves_next_offset_tokens(ADDR, creds):
        pytest.skip("the replica predates next-offset tokens (no Describe RPC)")
    chain = last_chain()
    plain = full_chain_answer(client_factory([PLAIN_ADDR], deadline=5.0), chain)
    # Reached, not waited for (a replica holding it would answer DEADLINE_EXCEEDED and the
    # client fail open): the answer is the proof, no clock read.
    r = mtls(client_factory, 5.0).match(KS, hashes=chain, min_offsets=plain.applied)
    assert r.outcome == "scores" and not r.stale and r.replica_id == "py-tls", r


def test_without_a_client_certificate_or_without_tls_it_fails_open(client_factory):
    chain = last_chain()
    # Server verified, but no client certificate: the handshake is refused (mTLS).
    r = client_factory([ADDR], deadline=2.0, root_certificates=pem("ca.pem")).match(KS, hashes=chain)
    assert r.outcome == "unavailable" and r.reason, r
    # Plaintext to a TLS port: never an exception, an "unavailable" outcome.
    r = client_factory([ADDR], deadline=2.0).match(KS, hashes=chain)
    assert r.outcome == "unavailable", r


def test_half_configured_mutual_tls_is_refused_up_front(client_factory):
    with pytest.raises(ValueError):
        client_factory([ADDR], root_certificates=pem("ca.pem"), private_key=pem("client.key"))
