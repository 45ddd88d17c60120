"""One TLS context for every HTTP client a process opens.

Building a context reads and parses the whole certificate store: about 20 ms of CPU, and an
identity's client built two (its own transport's and its proxy's). A batch run opened one client
per identity at its start, serially, while its first requests waited. A context is safe to share
between clients and threads; the settings are httpx's defaults, so certificates and host names
are checked as before.
"""

from __future__ import annotations

import ssl
import threading

import httpx

_lock = threading.Lock()
_context: ssl.SSLContext | None = None


def shared_tls_context() -> ssl.SSLContext:
    """The process's context: certifi's roots, certificates and host names checked (httpx's
    default; SSL_CERT_FILE and SSL_CERT_DIR are not read, as the clients' `trust_env=False` never
    read them). Built on first use."""
    global _context
    with _lock:
        if _context is None:
            _context = httpx.create_ssl_context(trust_env=False)
        return _context
