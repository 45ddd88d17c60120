"""Identity pool: what requests go out as (proxy + cookies + fingerprint), leased per source.

Identities come from the identities file (`config`), keep a health per source (`health`, a pure
state machine), are leased from the state store with fencing tokens (`pool`, its SQL hot path in
`store/leases.py`) by the rules of `leasing` (how a collection holds them, and for how long), and
send through a session (`sessions`): the identity's HTTP client and cookie jar, kept across runs,
and where the fetcher reports what each answer says of the identity. Plain Python, no Dagster:
`resources/identities.py` names the file for runs.
"""

from investigations.identities.config import IdentityCatalog, IdentitySpec, load_identities, parse_identities
from investigations.identities.health import HealthPolicy, IdentityVerdict, classify_for_identity
from investigations.identities.pool import IdentityPool
from investigations.identities.sessions import CookieStore

__all__ = [
    "CookieStore",
    "HealthPolicy",
    "IdentityCatalog",
    "IdentityPool",
    "IdentitySpec",
    "IdentityVerdict",
    "classify_for_identity",
    "load_identities",
    "parse_identities",
]
