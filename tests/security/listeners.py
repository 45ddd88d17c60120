"""Real HTTP listeners on loopback addresses that count every connection they accept.

A refused target must receive nothing: not a request, not even a TCP connection. Each listener
answers 200 (or a redirect it was told to send) and remembers the Host header of each request.
"""

from __future__ import annotations

import socket
import socketserver
import threading
from http.server import BaseHTTPRequestHandler


class Listener:
    """One HTTP server on `address:port` (port 0: a free one), in a thread, counting connections."""

    def __init__(self, address: str, port: int = 0, *, redirect_to: str | None = None) -> None:
        self.connections = 0
        self.hosts: list[str] = []
        self.redirect_to = redirect_to
        listener = self
        family = socket.AF_INET6 if ":" in address else socket.AF_INET

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server interface
                listener.hosts.append(self.headers.get("Host", ""))
                if listener.redirect_to is not None:
                    self.send_response(302)
                    self.send_header("Location", listener.redirect_to)
                    self.send_header("Content-Length", "0")
                    self.send_header("Connection", "close")  # the next hop needs a connection of its own
                    self.close_connection = True
                    self.end_headers()
                    return
                body = b'{"results": []}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        class Server(socketserver.ThreadingTCPServer):
            address_family = family
            daemon_threads = True
            allow_reuse_address = True

            def process_request(self, request, client_address):  # type: ignore[no-untyped-def]
                listener.connections += 1
                super().process_request(request, client_address)

        self.server = Server((address, port), Handler)
        self.address = address
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def listeners_on_one_port(*addresses: str) -> list[Listener]:
    """A listener on each address, all on the same port (a name answering either must hit that port)."""
    for _ in range(20):
        first = Listener(addresses[0])
        rest: list[Listener] = []
        try:
            for address in addresses[1:]:
                rest.append(Listener(address, first.port))
        except OSError:
            for opened in [first, *rest]:
                opened.close()
            continue
        return [first, *rest]
    raise RuntimeError(f"no port free on all of {addresses}")
