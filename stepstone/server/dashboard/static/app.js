// Stepstone dashboard: live refresh, confirmations and actions. Hand-written, no
// dependencies. Pages work without it for reading; actions need it.
"use strict";

(function () {
  const meta = (name) => (document.querySelector(`meta[name="${name}"]`) || {}).content || "";
  const base = meta("base");
  const csrf = meta("csrf-token");

  function toLogin() {
    const here = location.pathname.slice(base.length) + location.search;
    location.assign(`${base}/login?next=${encodeURIComponent(here || "/")}`);
  }

  // The JSON API, with the session cookie and the session's CSRF token.
  async function api(method, path, body) {
    const headers = { "X-CSRF-Token": csrf, "Accept": "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(`${base}/api/v1${path}`, {
      method, headers, credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status === 401) { toLogin(); throw new Error("signed out"); }
    const data = await response.json().catch(() => ({}));
    if (!response.ok) {
      const error = data.error || {};
      throw new Error(`${error.type || response.status}: ${error.message || response.statusText}`);
    }
    return data;
  }

  // -- confirmation ------------------------------------------------------------------------
  function confirmWith(text, label) {
    const dialog = document.getElementById("confirm");
    document.getElementById("confirm-text").textContent = text;
    document.getElementById("confirm-ok").textContent = label || "Confirm";
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
      dialog.returnValue = "";
      dialog.showModal();
    });
  }

  // -- live regions: re-fetch this page and swap #live, keeping open <details> -----------------
  function busy(region) {
    const active = document.activeElement;
    const editing = active && region.contains(active) && /^(SELECT|INPUT|TEXTAREA)$/.test(active.tagName);
    return document.hidden || editing || document.getElementById("confirm").open;
  }

  async function refresh(region) {
    if (busy(region)) return;
    const response = await fetch(location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } });
    if (response.redirected && new URL(response.url).pathname.endsWith("/login")) { toLogin(); return; }
    if (!response.ok) return;
    const page = new DOMParser().parseFromString(await response.text(), "text/html");
    const fresh = page.getElementById("live");
    if (!fresh || busy(region)) return;
    const open = new Set([...region.querySelectorAll("details[open]")].map((d) => d.id).filter(Boolean));
    const focused = document.activeElement && region.contains(document.activeElement) ? document.activeElement.id : "";
    region.replaceChildren(...fresh.childNodes);
    for (const id of open) { const d = document.getElementById(id); if (d) d.open = true; }
    if (focused) { const f = document.getElementById(focused); if (f) f.focus(); }
    if (!fresh.dataset.live) { delete region.dataset.live; return; }  // e.g. the run ended
    wire(region);
  }

  function live(region) {
    const every = Number(region.dataset.live) * 1000;
    const tick = async () => {
      try { await refresh(region); } catch (e) { /* offline: try again next tick */ }
      if (region.dataset.live) setTimeout(tick, every);
    };
    setTimeout(tick, every);
  }

  // -- actions ---------------------------------------------------------------------------------
  function say(text, isError) {
    const status = document.getElementById("action-status") || document.getElementById("job-status");
    if (!status) return;
    status.textContent = text;
    status.classList.toggle("err", Boolean(isError));
  }

  const actions = {
    async replay(button) {
      const result = await api("POST", `/runs/${encodeURIComponent(button.dataset.run)}/replay`);
      say(`Replaying: the run is ${result.status}.`);
      location.reload();
    },
    async resume(button) {
      const result = await api("POST", `/runs/${encodeURIComponent(button.dataset.run)}/resume`);
      say(`Resuming: the run is ${result.status}.`);
      location.reload();
    },
    async cancel(button) {
      const result = await api("POST", `/runs/${encodeURIComponent(button.dataset.run)}/cancel`);
      say(result.status === "cancelled" ? "Cancelled." : "Cancelling after the step executing now.");
      location.reload();
    },
    async rerun(button) {
      const body = { step_id: document.getElementById("rerun-step").value };
      const data = document.getElementById("rerun-data").value.trim();
      if (data) {
        try { body.event_data = JSON.parse(data); } catch (e) { throw new Error(`Event data is not JSON: ${e.message}`); }
      }
      const result = await api("POST", `/runs/${encodeURIComponent(button.dataset.run)}/rerun`, body);
      location.assign(`${base}/runs/${encodeURIComponent(result.id)}`);
    },
    async signal(button) {
      const status = document.getElementById("signal-status");
      const name = document.getElementById("signal-name").value.trim();
      let data;
      try {
        data = JSON.parse(document.getElementById("signal-data").value.trim() || "null");
      } catch (error) {
        throw new SignalError(`The data is not JSON: ${error.message}`);
      }
      try {
        const result = await api("POST", `/runs/${encodeURIComponent(button.dataset.run)}/signals`, { name, data });
        status.textContent = `Signal ${result.name} sent (${result.id}).`;
        status.classList.remove("err");
      } catch (error) {
        throw new SignalError(error.message);
      } finally {
        button.disabled = false;
      }
    },
    async send(button) {
      const status = document.getElementById("send-status");
      const name = document.getElementById("send-name");
      const text = document.getElementById("send-data");
      const data = eventData(name, text, status);
      try {
        if (data === undefined) return;
        const result = await api("POST", "/events", { name: name.value.trim(), data });
        status.textContent = `Sent ${name.value.trim()}: event ${result.ids[0]}.`;
        status.classList.remove("err");
      } catch (error) {
        status.textContent = error.message;  // the server's own check, e.g. a reserved name
        status.classList.add("err");
      } finally {
        button.disabled = false;
      }
    },
    async resend(button) {
      document.getElementById("send-name").value = button.dataset.name;
      document.getElementById("send-data").value = JSON.stringify(JSON.parse(button.dataset.json), null, 2);
      document.getElementById("send-status").textContent = "Edit the event if you like, then send it.";
      document.getElementById("send-data").focus();
      button.disabled = false;
    },
    async invoke(button) {
      const status = document.getElementById(`invoke-status-${button.dataset.index}`);
      const text = document.getElementById(`invoke-data-${button.dataset.index}`);
      const data = jsonObject(text, status);
      try {
        if (data === undefined) return;
        const fn = encodeURIComponent(button.dataset.function);
        const result = await api("POST", `/functions/${fn}/invoke`, { data });
        if (!result.run_id) { status.textContent = "No run started: the function's flow control skipped it."; return; }
        location.assign(`${base}/runs/${encodeURIComponent(result.run_id)}`);
      } catch (error) {
        status.textContent = error.message;
        status.classList.add("err");
      } finally {
        button.disabled = false;
      }
    },
    async addApp(button) {
      const status = document.getElementById("app-status");
      const field = document.getElementById("app-url");
      field.removeAttribute("aria-invalid");
      try {
        if (!field.value.trim()) { invalid(field, status, "Give the endpoint's URL."); return; }
        const app = await api("POST", "/apps", { url: field.value.trim() });
        status.textContent = `Synced ${app.app}: ${app.functions.length} function(s).`;
        status.classList.remove("err");
        location.reload();
      } catch (error) {
        invalid(field, status, error.message);  // the server's reason: bad URL, unreachable, signature, conflict
      } finally {
        button.disabled = false;
      }
    },
    async syncApp(button) {
      try {
        await api("POST", "/apps", { url: button.dataset.url });
      } finally {
        location.reload();  // the row shows the outcome: a new sync time, or the failure's reason
      }
    },
    async unregisterApp(button) {
      await api("DELETE", `/apps?url=${encodeURIComponent(button.dataset.url)}`);
      location.reload();
    },
    async bulk(button) {
      const d = button.dataset;
      const body = { function_id: d.function };
      if (d.since) body.since = Number(d.since);
      if (d.until) body.until = Number(d.until);
      if (d.if) body.if = d.if;
      if (d.kind === "replay") body.status = [d.status];
      const job = await api("POST", `/runs/${d.kind}-many`, body);
      button.disabled = true;
      await follow(job);
    },
  };

  // The send form's JSON, checked before anything is sent; undefined (with the
  // reason shown) when the name is blank or the data is not a JSON object.
  function eventData(name, text, status) {
    name.removeAttribute("aria-invalid");
    if (!name.value.trim()) return invalid(name, status, "Give the event a name.");
    return jsonObject(text, status);
  }

  // Marks `field` invalid and shows why in `status`; returns undefined.
  function invalid(field, status, message) {
    field.setAttribute("aria-invalid", "true");
    status.textContent = message;
    status.classList.add("err");
    field.focus();
    return undefined;
  }

  // A textarea's JSON object, or undefined with the reason shown.
  function jsonObject(text, status) {
    const fail = (message) => invalid(text, status, message);
    text.removeAttribute("aria-invalid");
    let data;
    try { data = JSON.parse(text.value.trim() || "{}"); } catch (error) {
      return fail(`The data is not valid JSON: ${error.message}`);
    }
    if (data === null || typeof data !== "object" || Array.isArray(data)) {
      return fail("The data must be a JSON object, like {\"user_id\": 42}.");
    }
    return data;
  }

  async function follow(job) {
    const box = document.getElementById("job-progress");
    const bar = document.getElementById("job-bar");
    box.hidden = false;
    for (;;) {
      bar.max = Math.max(job.examined, 1);
      bar.value = job.done;
      say(`Job ${job.id}: ${job.status}, ${job.done} done of ${job.examined} examined.`, job.status === "failed");
      if (!["queued", "running"].includes(job.status)) break;
      await new Promise((resolve) => setTimeout(resolve, 300));
      job = await api("GET", `/jobs/${encodeURIComponent(job.id)}`);
    }
    if (job.status === "completed") bar.value = bar.max;
    box.dataset.finished = job.status;
  }

  // A signal's failure is told beside its form, not in the run's action status.
  class SignalError extends Error {}

  async function act(button) {
    const verb = button.textContent.trim();
    if (button.dataset.confirm && !(await confirmWith(button.dataset.confirm, verb))) return;
    button.disabled = true;
    try {
      await actions[button.dataset.action](button);
    } catch (error) {
      if (error instanceof SignalError) {
        const status = document.getElementById("signal-status");
        status.textContent = error.message;
        status.classList.add("err");
      } else {
        say(error.message, true);
      }
      button.disabled = false;
    }
  }

  function wire(root) {
    for (const button of root.querySelectorAll("button[data-action]")) {
      if (button.dataset.wired) continue;
      button.dataset.wired = "1";
      button.addEventListener("click", () => act(button));
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    wire(document);
    const form = document.getElementById("send-event");
    if (form) form.addEventListener("submit", (event) => { event.preventDefault(); act(form.querySelector("[data-action=send]")); });
    const addApp = document.getElementById("add-app");
    if (addApp) addApp.addEventListener("submit", (event) => { event.preventDefault(); act(addApp.querySelector("[data-action=addApp]")); });
    for (const region of document.querySelectorAll("[data-live]")) live(region);
  });
})();
