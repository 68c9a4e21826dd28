"""An OAUTHBEARER token provider for test brokers: unsecured JWTs (`alg: none`) with `sub` = the principal,
which Kafka's default (unsecured) validator accepts. Named in settings as
`kafka.security.oauth_token_provider = "tests.support.oauth:provider"`. Test-only: real deployments point
the setting at a provider that fetches tokens from their identity provider.
"""

from __future__ import annotations

import base64
import json
import time

from aiokafka.abc import AbstractTokenProvider

SUBJECT = "svc-oauth"


def _b64(obj: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


class UnsecuredTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
    """A fresh one-hour token for `SUBJECT` on every call."""

    async def token(self) -> str:
        now = int(time.time())
        return f"{_b64({'alg': 'none'})}.{_b64({'sub': SUBJECT, 'iat': now, 'exp': now + 3600})}."


def provider() -> UnsecuredTokenProvider:
    return UnsecuredTokenProvider()
