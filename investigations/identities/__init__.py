"""Identity pool: what requests go out as (proxy + cookies + fingerprint), leased per source.

Identities come from the identities file (`config`), keep a health per source (`health`, a pure
state machine), are leased from the state store with fencing tokens (`pool`, its SQL hot path in
`store/leases.py`) by the rules of `leasing` (how a collection holds them, and for how long), and
send through a session (`sessions`): the identity's HTTP client and cookie jar, kept across runs,
and where the fetcher reports what each answer says of the identity. Plain Python, no Dagster:
`resources/identities.py` names the file for runs.
"""

from investigations.identities.config import (
    DEFAULT_FINGERPRINT,
    DIRECT_CATALOG,
    DIRECT_ID,
    FingerprintSpec,
    IdentityCatalog,
    IdentityError,
    IdentitySpec,
    load_identities,
    parse_identities,
    redact_proxy_url,
)
from investigations.identities.health import (
    DEFAULT_BLOCK_MARKERS,
    DEFAULT_POLICY,
    HEALTHY,
    HealthEvent,
    HealthPolicy,
    IdentityHealth,
    IdentityVerdict,
    choose_tier,
    classify_for_identity,
    health_event,
    next_health,
    next_tier_state,
    range_should_rest,
    rest_s,
)
from investigations.identities.pool import IdentityPool, IdentityUnavailable, Lease, identity_lane_name
from investigations.identities.sessions import CookieStore, IdentityBlocked, IdentitySession, Sessions

__all__ = [
    "IdentityBlocked",
    "IdentitySession",
    "Sessions",
    "DEFAULT_BLOCK_MARKERS",
    "DEFAULT_FINGERPRINT",
    "DEFAULT_POLICY",
    "DIRECT_CATALOG",
    "DIRECT_ID",
    "HEALTHY",
    "CookieStore",
    "FingerprintSpec",
    "HealthEvent",
    "HealthPolicy",
    "IdentityCatalog",
    "IdentityError",
    "IdentityHealth",
    "IdentityPool",
    "IdentitySpec",
    "IdentityUnavailable",
    "IdentityVerdict",
    "Lease",
    "choose_tier",
    "classify_for_identity",
    "health_event",
    "identity_lane_name",
    "load_identities",
    "next_health",
    "next_tier_state",
    "parse_identities",
    "range_should_rest",
    "redact_proxy_url",
    "rest_s",
]
