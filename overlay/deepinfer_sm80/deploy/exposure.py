"""Who can reach the API server: loopback addresses, and the rule for anything wider.

The address that matters is the one other machines see. In a container that is the host
address compose publishes the port on (``BIND_ADDRESS``, passed in as
``DEEPINFER_PUBLISHED_HOST``), not the container-side listen address; outside a
container it is the address the server listens on.
"""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and ``localhost``; every other name or address counts as wider."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


ALLOW_ENV = "DEEPINFER_ALLOW_UNAUTHENTICATED"
PUBLISHED_ENV = "DEEPINFER_PUBLISHED_HOST"


def refusal(reachable_at: str, api_key: str | None, allow: str | None) -> str | None:
    """Why the server must not start (None when it may): a server reachable beyond
    loopback without ``VLLM_API_KEY`` answers anyone who can route to it. An explicit
    ``DEEPINFER_ALLOW_UNAUTHENTICATED=1`` (a trusted network, a proxy that authenticates)
    lifts the rule; any other value of it is refused rather than guessed at."""
    if allow not in (None, "", "0", "1"):
        return f"{ALLOW_ENV}={allow!r}: use 1 (allow) or 0 (refuse, the default)"
    if is_loopback(reachable_at) or (api_key or "").strip() or allow == "1":
        return None
    return (
        f"the server would be reachable at {reachable_at} without an API key: set "
        f"VLLM_API_KEY (clients then send `Authorization: Bearer <key>`), keep BIND_ADDRESS "
        f"on 127.0.0.1, or set {ALLOW_ENV}=1 to serve without authentication on purpose"
    )
