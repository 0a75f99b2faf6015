"""The code whose live runs tests/histories/*.json were exported from
(``stepstone runs export RUN_ID > tests/histories/NAME.json``): change a step
here and test_histories.py says whether those runs still fit."""

from __future__ import annotations

from typing import Any

import stepstone as ss

app = ss.App("shop-histories", database_url="sqlite:///.stepstone/shop-histories.db")


def charge(amount: int) -> dict[str, Any]:
    return {"id": f"ch_{amount}", "amount": amount}


def send_receipt(payment: dict[str, Any]) -> str:
    return f"receipt {payment['id']}"


@app.function(id="checkout", trigger=ss.on_event("order.placed"))
async def checkout(ctx: ss.Context) -> dict[str, Any]:
    payment = await ctx.step.run("charge", charge, ctx.event.data["amount"])
    await ctx.step.run("receipt", send_receipt, payment)
    shipped = await ctx.step.wait_for_event("shipped", event="order.shipped", timeout="7d")
    return {"payment": payment["id"], "shipped": shipped is not None}
