"""``stepstone init``: a new project's first module, in one command.

It writes a small working app (an event-triggered function with a retried step,
a durable sleep and a second step) that ``stepstone dev`` serves at once, and
never overwrites a file."""

from __future__ import annotations

from pathlib import Path

import click

from stepstone.cli.common import console

TEMPLATE = '''"""A Stepstone app. Serve it with the dashboard:  stepstone dev {module}:app
Then send it an event:  stepstone send signup.completed --data '{{"email": "ada@example.com"}}'
(with the STEPSTONE_URL and STEPSTONE_API_KEY that `stepstone dev` prints), or
use the dashboard's "Send event" form."""

import stepstone as ss

app = ss.App("{module}")  # SQLite at ./.stepstone/stepstone.db; $STEPSTONE_DATABASE_URL overrides


def send_welcome(email: str) -> dict[str, str]:
    # A side effect: retried on failure, never repeated once it succeeded.
    return {{"sent_to": email}}


@app.function(id="welcome", trigger=ss.on_event("signup.completed"), retries=3)
async def welcome(ctx: ss.Context) -> dict[str, object]:
    email = ctx.event.data["email"]
    receipt = await ctx.step.run("send-welcome", send_welcome, email)
    await ctx.step.sleep("wait-a-day", "1d")  # durable: no worker is held while it sleeps
    follow_up = await ctx.step.run("send-follow-up", lambda: f"follow-up for {{email}}")
    return {{"welcome": receipt, "follow_up": follow_up}}
'''


@click.command()
@click.argument("path", default="stepstone_app.py", type=click.Path(dir_okay=False, path_type=Path))
def init(path: Path) -> None:
    """Write a working app module to PATH (default stepstone_app.py); never overwrites."""
    module = path.stem
    if path.suffix != ".py" or not module.isidentifier():
        raise click.BadParameter(f"{str(path)!r} must be a .py file named like a module", param_hint="PATH")
    if path.exists():
        raise click.ClickException(f"{path} already exists: not overwriting it")
    try:
        with path.open("x") as out:  # "x": a file created meanwhile is not overwritten either
            out.write(TEMPLATE.format(module=module))
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc.strerror}") from exc
    console.print(f"Wrote {path}. Next:\n  stepstone dev {module}:app", highlight=False)
