"""Refusing a taken port before serving: uvicorn would otherwise start the app,
log a bind error and exit, and ``stepstone dev``'s reload loop would wait for a
code change that cannot help. ``PortInUse`` exits with its own status so the
reload loop can tell it from a crash of the user's code."""

from __future__ import annotations

import socket

import click

PORT_IN_USE = 3


class PortInUse(click.ClickException):
    exit_code = PORT_IN_USE


def check_port(host: str, port: int) -> None:
    """Raise ``PortInUse`` naming ``host:port`` if nothing can listen there now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise PortInUse(
                f"port {port} on {host} is already in use ({exc.strerror}): "
                f"stop the process holding it or choose another with --port"
            ) from exc
