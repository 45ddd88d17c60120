"""A local fake web (robust, fragile, flaky, quiet, slow and banning sources) for tests and benches, on
loopback, and forward proxies on 127.0.0.x addresses to reach it as distinct clients."""

from investigations.sandbox.app import SandboxHandle, create_app, serve, start_in_thread
from investigations.sandbox.behaviour import SandboxConfig, SandboxState
from investigations.sandbox.proxy import ForwardProxy, ProxyGroup, loopback_hosts, start_proxies

__all__ = [
    "ForwardProxy",
    "ProxyGroup",
    "SandboxConfig",
    "SandboxHandle",
    "SandboxState",
    "create_app",
    "loopback_hosts",
    "serve",
    "start_in_thread",
    "start_proxies",
]
