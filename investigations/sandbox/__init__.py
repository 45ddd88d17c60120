"""A local fake web (robust, fragile, flaky, quiet and slow sources) for tests and benches, on loopback."""

from investigations.sandbox.app import SandboxHandle, create_app, serve, start_in_thread
from investigations.sandbox.behaviour import SandboxConfig, SandboxState

__all__ = ["SandboxConfig", "SandboxHandle", "SandboxState", "create_app", "serve", "start_in_thread"]
