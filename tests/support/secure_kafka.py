"""A local broker with TLS, SASL SCRAM and the KRaft StandardAuthorizer (test-only).

Listeners (all on 127.0.0.1):
- PLAINTEXT: the harness's own (readiness probe, topic creation, `acls.grant`); its principal
  `User:ANONYMOUS` is the super user (the controller listener needs it too).
- SASL_SSL: SCRAM-SHA-256 and SCRAM-SHA-512 users created at storage-format time (`--add-scram`).
- MTLS (SSL with `ssl.client.auth=required`): the principal is the client certificate's CN.
- SASL_PLAINTEXT: PLAIN (the same users) and OAUTHBEARER with Kafka's unsecured-JWT validator
  (`tests/support/oauth.py` makes such tokens; the principal is the token's `sub`).
Without an ACL every other principal may do nothing (`allow.everyone.if.no.acl.found=false`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from devtools.kafka_local import HOST, ExtraListener, LocalKafka, free_port
from tests.support.certs import TestCA


@dataclass
class SecureKafka:
    """A started secured broker and what clients need to reach it."""

    broker: LocalKafka
    ca: TestCA
    users: dict[str, str]
    sasl_ssl: str
    mtls: str
    sasl_plaintext: str

    @property
    def admin(self) -> str:
        """The super-user PLAINTEXT bootstrap (harness only)."""
        return self.broker.bootstrap_servers

    def stop(self) -> None:
        self.broker.stop()


def start_secure_kafka(folder: Path, users: Mapping[str, str]) -> SecureKafka:
    """Generate a CA and broker certificate in `folder`, start the broker (blocking, ~10-60 s) with the
    SCRAM `users` (name -> password). Raises `devtools.kafka_local.BrokerError`."""
    ca = TestCA(folder)
    server = ca.issue("broker", server=True)
    sasl_port, mtls_port, plain_port = free_port(), free_port(), free_port()
    plain_users = " ".join(f'user_{name}="{password}"' for name, password in users.items())
    mechanisms = ("SCRAM-SHA-256", "SCRAM-SHA-512")
    scram_login = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    props = {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(server.bundle),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(ca.cert_file),
        "sasl.enabled.mechanisms": ",".join(mechanisms),
        **{f"listener.name.sasl_ssl.{m.lower()}.sasl.jaas.config": scram_login for m in mechanisms},
        "listener.name.mtls.ssl.client.auth": "required",
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN,OAUTHBEARER",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};"
        ),
        "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config": (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            'unsecuredLoginStringClaim_sub="broker";'
        ),
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]+).*$/$1/,DEFAULT",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
        "allow.everyone.if.no.acl.found": "false",
    }
    format_args: list[str] = []
    for name, password in users.items():
        for mechanism in mechanisms:
            format_args += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
    broker = LocalKafka(
        extra_listeners=[
            ExtraListener("SASL_SSL", "SASL_SSL", sasl_port),
            ExtraListener("MTLS", "SSL", mtls_port),
            ExtraListener("SASL_PLAINTEXT", "SASL_PLAINTEXT", plain_port),
        ],
        extra_properties=props,
        format_args=format_args,
    )
    broker.start()
    return SecureKafka(
        broker, ca, dict(users), f"{HOST}:{sasl_port}", f"{HOST}:{mtls_port}", f"{HOST}:{plain_port}"
    )
