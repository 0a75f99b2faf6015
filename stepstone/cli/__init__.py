"""The ``stepstone`` command line (click + rich), one module per concern:

``main`` the group and logging; ``common`` shared options, app loading and
where commands act (a database, or a server through ``ss.Client``);
``worker`` worker and migrate; ``events`` send; ``runs`` runs list/show/...;
``inventory`` functions and workers; ``serve`` server and dev; ``reload`` the
dev file watcher; ``render`` tables and JSON.
"""

from stepstone.cli.common import load_app
from stepstone.cli.main import main

__all__ = ["load_app", "main"]
