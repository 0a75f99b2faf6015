"""A Flask application that serves the functions of ``served_app`` beside its
own routes, as a team's existing web app would: ``ss.serve_wsgi`` mounted at
``/api/stepstone`` with werkzeug's dispatcher, under Flask's own threaded
server. ``python flask_app.py PORT``."""

from __future__ import annotations

import importlib
import sys

from flask import Flask
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.serving import run_simple

served = importlib.import_module("served_app")  # beside this file, as a script sees it

shop = Flask("shop")


@shop.get("/")
def home() -> str:
    return "the shop's own page"


shop.wsgi_app = DispatcherMiddleware(shop.wsgi_app, {"/api/stepstone": served.wsgi})  # type: ignore[method-assign]

if __name__ == "__main__":
    run_simple("127.0.0.1", int(sys.argv[1]), shop, threaded=True)
