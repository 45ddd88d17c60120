"""A local fake web (robust, fragile, flaky, quiet, slow and banning sources) for tests and benches, on
loopback, and forward proxies on 127.0.0.x addresses to reach it as distinct clients."""

from investigations.sandbox.app import create_app, serve, start_in_thread
from investigations.sandbox.behaviour import SandboxConfig

__all__ = [
    "SandboxConfig",
    "create_app",
    "serve",
    "start_in_thread",
]
