(function () {
  "use strict";
  // The operator console (docs/pages.md): a card per target with its state, figures and charts of the last five
  // minutes, sampled every second from the stats route; its controls PATCH the config route, so each changes
  // only the settings it names.
  const config = JSON.parse(document.getElementById("vq-config").textContent);
  for (const type of config.types) document.getElementById("watch-type").append(new Option(type));
  const queuesUrl = new URL(config.queues, location.href);
  const SAMPLE_MS = 1000;
  const KEEP = 300;  // samples per target: the last five minutes
  const RATE_WINDOW_MS = 6000;
  // The tick lengths (ms) a rate is tried with, for a whole number of people per tick: the default first (vq's).
  const TICKS_FOR_A_RATE = [2000, 1000, 500, 5000, 10000, 30000, 60000];
  const STATES = {
    ADMITTING: "admitting", WAITING: "waiting: the pump has not ticked lately", IDLE: "idle", PAUSED: "paused",
    SOLD_OUT: "sold out", CLOSED: "closed to newcomers", SCHEDULED: "scheduled",
  };
  // With the safety net on: how a newcomer gets in now (stats' entryMode).
  const ENTRY_MODES = { PASSING_THROUGH: "passing through", QUEUEING: "queueing" };
  const cards = new Map();  // "type/id" -> the target's card and its samples
  const number = new Intl.NumberFormat("en", { maximumFractionDigits: 1 });
  const clock = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" });
  const filter = document.getElementById("filter");

  function watched() {
    let list = [];
    try { list = JSON.parse(localStorage.getItem("vq-console-watch")) || []; } catch (err) { /* none */ }
    for (const asked of new URLSearchParams(location.search).getAll("watch")) list.push(asked);
    return list.filter((name) => {
      const [type, id, ...more] = name.split("/");
      return config.types.includes(type) && /^[1-9][0-9]{0,17}$/.test(id || "") && more.length === 0;
    });
  }

  function remember(name) {
    const list = [...new Set([...watched(), name])];
    try { localStorage.setItem("vq-console-watch", JSON.stringify(list)); } catch (err) { /* not kept */ }
  }

  async function getJson(url, options) {
    const response = await fetch(url, { cache: "no-store", ...options });
    const body = await response.json().catch(() => null);
    if (!response.ok) {
      throw new Error(body && body.code ? `${body.code}: ${body.detail}` : `HTTP ${response.status}`);
    }
    return body;
  }

  const targetUrl = (name, what) => new URL(`${config.queues}/${name}/${what}`, location.href);

  async function refreshList() {
    let listed = [];
    try {
      listed = (await getJson(queuesUrl)).targets.map((t) => `${t.type}/${t.id}`);
    } catch (err) { /* the watched ones are shown all the same */ }
    for (const name of [...listed, ...watched()]) if (!cards.has(name)) addCard(name);
    arrange();
  }

  function addCard(name) {
    const node = document.getElementById("target-card").content.firstElementChild.cloneNode(true);
    node.dataset.target = name;
    node.setAttribute("aria-label", name.replace("/", " "));
    node.querySelector(".title").textContent = name.replace("/", " ");
    const card = { name, node, samples: [], stats: null, edited: false };
    const act = (action, handler) => node.querySelector(`[data-action=${action}]`).addEventListener("click", handler);
    act("pause", () => change(card, { paused: card.stats && card.stats.config.paused ? null : true }));
    act("soldout", () => {
      if (card.stats && card.stats.config.soldOut) return change(card, { soldOut: null });
      if (confirm(`Mark ${name} sold out? Everyone waiting is told at their next poll.`)) change(card, { soldOut: true });
    });
    act("rate", () => {
      const pace = paceOf(Number(field(card, "rate").value));
      if (!pace) return report(card, "bad", "Not saved: give a rate of at least one person a minute (0.02/s)");
      change(card, pace);
    });
    act("capacity", () => change(card, { maxWaiting: Number(field(card, "maxWaiting").value) || null }));
    act("schedule", () => {
      const times = {};
      for (const name of ["opensAt", "closesAt"]) {
        const value = field(card, name).value;
        times[name] = value ? new Date(value).toISOString() : null;
      }
      change(card, times);
    });
    for (const input of node.querySelectorAll("input")) {
      input.addEventListener("input", () => { card.edited = true; });
      // Enter in a field presses its fieldset's button.
      input.addEventListener("keydown", (event) => {
        if (event.key === "Enter") input.closest("fieldset").querySelector("button").click();
      });
    }
    field(card, "rate").addEventListener("input", () => {
      const pace = paceOf(Number(field(card, "rate").value));
      node.querySelector("[data-hint=rate]").textContent = pace ? `${pace.batch} every ${pace.tickMs} ms` : "";
    });
    document.getElementById("empty").hidden = true;
    document.getElementById("targets").append(node);
    cards.set(name, card);
    arrange();
    sample(card);
  }

  const field = (card, name) => card.node.querySelector(`[data-field=${name}]`);

  // A rate in people per second as batch and tickMs: the first tick length that takes a whole number of people.
  function paceOf(perSecond) {
    if (!(perSecond > 0)) return null;
    for (const tickMs of TICKS_FOR_A_RATE) {
      const batch = perSecond * tickMs / 1000;
      if (batch >= 1 && Math.abs(batch - Math.round(batch)) < 1e-9) return { batch: Math.round(batch), tickMs };
    }
    const tickMs = 60000;  // else the nearest whole number of people a minute
    return perSecond * 60 >= 1 ? { batch: Math.round(perSecond * 60), tickMs } : null;
  }

  function report(card, kind, text) {
    const result = card.node.querySelector(".result");
    result.className = `result ${kind}`;
    result.textContent = text;
  }

  // A JSON Merge Patch of the target's configuration: only the settings named change (null removes one).
  async function change(card, patch) {
    report(card, "", "Saving…");
    try {
      const answer = await getJson(targetUrl(card.name, "config"), {
        method: "PATCH", headers: { "Content-Type": "application/merge-patch+json" }, body: JSON.stringify(patch),
      });
      card.edited = false;
      report(card, "", `Saved at ${clock.format(new Date())}: ${describe(patch)}. Now: ${JSON.stringify(answer.config)}`);
      await sample(card);
    } catch (err) {
      report(card, "bad", `Not saved: ${err.message}`);
    }
  }

  const describe = (patch) => Object.entries(patch)
    .map(([name, value]) => (value === null ? `${name} removed` : `${name} ${JSON.stringify(value)}`)).join(", ");

  async function sample(card) {
    if (card.busy) return;  // a slow answer: skip a beat rather than pile requests up
    card.busy = true;
    let stats;
    try {
      stats = await getJson(targetUrl(card.name, "stats"));
    } catch (err) {
      card.node.querySelector(".figures").textContent = `Stats unavailable: ${err.message}`;
      return;
    } finally {
      card.busy = false;
    }
    const at = Date.now();
    // Rates over the last RATE_WINDOW_MS: the pump admits once a tick (2 s by default), so a rate between two
    // samples a second apart would swing between 0 and twice the rate.
    const previous = card.samples.find((s) => at - s.at <= RATE_WINDOW_MS) || card.samples[card.samples.length - 1];
    const perSecond = (counter) => {
      if (!previous) return null;
      return Math.max(0, (counter(stats) - counter(previous.stats)) / ((at - previous.at) / 1000));
    };
    card.samples.push({
      at, stats,
      waiting: stats.waitingCount, preQueued: stats.preQueuedCount,
      admitted: perSecond((s) => s.admittedCount + s.passedThroughCount),
      orders: perSecond((s) => s.ordersCount),
      configured: stats.configuredRatePerSec,
      effective: stats.effectiveRatePerSec,
      p95: stats.p95WaitSeconds,
    });
    if (card.samples.length > KEEP) card.samples.shift();
    const activeBefore = card.stats && active(card);
    card.stats = stats;
    draw(card);
    if (activeBefore !== active(card)) arrange();
  }

  // --- order and filter ---

  const active = (card) => Boolean(card.stats && card.stats.waitingCount + card.stats.preQueuedCount > 0);

  // Targets with people in line first, then by type, then by id as a number.
  function compare(a, b) {
    const [typeA, idA] = a.name.split("/");
    const [typeB, idB] = b.name.split("/");
    return (active(b) - active(a)) || typeA.localeCompare(typeB) || (idA.length - idB.length) || idA.localeCompare(idB);
  }

  function arrange() {
    const main = document.getElementById("targets");
    const sorted = [...cards.values()].sort(compare);
    // Moving a card would take the keyboard's focus from its controls: wait until the operator is done there.
    if (main.contains(document.activeElement) && document.activeElement !== main) return;
    sorted.forEach((card, i) => {
      if (main.children[i + 1] !== card.node) main.insertBefore(card.node, main.children[i + 1] || null);
    });
    applyFilter();
  }

  function applyFilter() {
    const words = filter.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    let shown = 0;
    for (const card of cards.values()) {
      const c = card.stats ? card.stats.config : {};
      const text = [card.name, card.name.replace("/", " "), c.displayName || "",
        card.stats ? STATES[card.stats.state] || card.stats.state : "",
        card.stats && c.safetyNet ? ENTRY_MODES[card.stats.entryMode] || "" : ""].join(" ").toLowerCase();
      card.node.hidden = !words.every((word) => text.includes(word));
      if (!card.node.hidden) shown += 1;
    }
    document.getElementById("shown").textContent = `${shown} of ${cards.size} targets shown`;
  }

  filter.addEventListener("input", applyFilter);
  document.addEventListener("keydown", (event) => {
    const typing = ["INPUT", "SELECT", "TEXTAREA"].includes(document.activeElement.tagName);
    if (event.key === "/" && !typing) { event.preventDefault(); filter.focus(); }
    if (event.key === "Escape" && document.activeElement === filter) { filter.value = ""; applyFilter(); }
  });

  // --- drawing ---

  function draw(card) {
    const { node, samples, stats } = card;
    const c = stats.config;
    const last = samples[samples.length - 1];
    const rate = (value) => (value == null ? "–" : `${number.format(value)}/s`);
    // How the range each admitted user was first told held, and etaSeconds' median error (docs/waits.md).
    const etaHeld = (accuracy) =>
      accuracy && accuracy.samples
        ? `${number.format(Math.round(100 * accuracy.insideRangeShare))} % of ${number.format(accuracy.samples)}, ±${number.format(accuracy.medianAbsErrorSeconds)} s`
        : "–";
    const badges = node.querySelector(".badges");
    badges.textContent = "";
    const badge = (text, kind) => { const b = document.createElement("span"); b.className = `badge ${kind}`; b.textContent = text; badges.append(b); };
    if (c.displayName) badge(c.displayName, "");
    const opens = stats.state === "SCHEDULED" && c.opensAt ? ` · opens ${new Date(c.opensAt).toLocaleString()}` : "";
    badge((STATES[stats.state] || stats.state) + opens, `state state-${stats.state}`);
    node.dataset.state = stats.state;
    if (c.safetyNet) badge(`safety net: ${ENTRY_MODES[stats.entryMode] || stats.entryMode}`, `net net-${stats.entryMode}`);
    const figures = [
      ["waiting", number.format(stats.waitingCount)], ["pre-queue", number.format(stats.preQueuedCount)],
      ["admitted", number.format(stats.admittedCount)], ["passed through", number.format(stats.passedThroughCount)],
      ["not done (active)", number.format(stats.activeCount)],
      ["configured", rate(stats.configuredRatePerSec)], ["effective", rate(stats.effectiveRatePerSec)],
      ["measured (last min)", rate(stats.admissionRatePerSec)],
      ["wait avg", stats.waitsMeasured ? `${number.format(stats.avgWaitSeconds)} s` : "–"],
      ["wait p95", stats.waitsMeasured ? `${number.format(stats.p95WaitSeconds)} s (of ${number.format(stats.waitsMeasured)})` : "–"],
      ["ETA range held", etaHeld(stats.etaAccuracy)],
      ["orders", number.format(stats.ordersCount)],
      [`shop p95 (last ${stats.recentShop.windowSeconds} s)`, stats.recentShop.p95Ms != null ? `${stats.recentShop.p95Ms} ms` : "–"],
      ["shop errors", stats.recentShop.errorRate != null ? `${number.format(100 * stats.recentShop.errorRate)} %` : "–"],
      ["left", number.format(stats.leftCount)], ["evicted", number.format(stats.evictedCount)],
    ];
    if (stats.openingDraw) figures.push(["draw", stats.openingDraw.seed ? "seed published" : "seed committed"]);
    const box = node.querySelector(".figures");
    box.textContent = "";
    for (const [label, value] of figures) {
      const span = document.createElement("span");
      span.append(`${label} `);
      const b = document.createElement("b");
      b.textContent = value;
      span.append(b);
      box.append(span);
    }
    const pause = node.querySelector("[data-action=pause]");
    pause.textContent = c.paused ? "Resume" : "Pause";
    pause.className = c.paused ? "" : "quiet";
    node.querySelector("[data-action=soldout]").textContent = c.soldOut ? "Clear sold out" : "Mark sold out";
    if (!card.edited && !node.contains(document.activeElement)) {
      field(card, "rate").value = Number((c.batch * 1000 / c.tickMs).toFixed(3));
      node.querySelector("[data-hint=rate]").textContent = `${c.batch} every ${c.tickMs} ms`;
      field(card, "maxWaiting").value = c.maxWaiting;
      field(card, "opensAt").value = localInput(c.opensAt);
      field(card, "closesAt").value = localInput(c.closesAt);
    }
    chart(node, "waiting", [["waiting", "var(--blue)"], ["preQueued", "var(--violet)"]], samples, number.format(last.waiting));
    chart(node, "admitted", [["admitted", "var(--blue)"], ["configured", "var(--soft)"], ["effective", "var(--amber)"]], samples, rate(last.admitted));
    chart(node, "orders", [["orders", "var(--green)"], ["configured", "var(--soft)"], ["effective", "var(--amber)"]], samples, rate(last.orders));
    chart(node, "p95", [["p95", "var(--violet)"]], samples, last.p95 == null ? "–" : `${number.format(last.p95)} s`);
    applyFilter();
  }

  function localInput(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    return new Date(d.getTime() - d.getTimezoneOffset() * 60000).toISOString().slice(0, 19);
  }

  // One line chart with its axes: values from 0 to the largest shown (with the unit), times from the oldest
  // sample kept to now (the window grows from 20 s to the five minutes kept).
  function chart(node, name, series, samples, now) {
    const figure = node.querySelector(`[data-chart=${name}]`);
    const svg = figure.querySelector("svg");
    const values = samples.flatMap((s) => series.map(([key]) => s[key])).filter((v) => v != null);
    const top = niceCeiling(Math.max(1, ...values));
    const newest = samples[samples.length - 1].at;
    const span = Math.max(newest - samples[0].at, 20000);
    svg.textContent = "";
    for (const y of [0, 50, 100]) {
      const grid = document.createElementNS("http://www.w3.org/2000/svg", "line");
      grid.setAttribute("class", "grid");
      for (const [k, v] of [["x1", 0], ["x2", 300], ["y1", y], ["y2", y]]) grid.setAttribute(k, v);
      svg.append(grid);
    }
    for (const [key, colour] of series) {
      const points = samples.filter((s) => s[key] != null)
        .map((s) => `${(300 - 300 * (newest - s.at) / span).toFixed(1)},${(100 - 100 * s[key] / top).toFixed(1)}`);
      if (!points.length) continue;
      const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
      line.setAttribute("points", points.length === 1 ? `${points[0]} ${points[0]}` : points.join(" "));
      line.setAttribute("stroke", colour);
      svg.append(line);
    }
    const unit = figure.dataset.unit;
    figure.querySelector(".top").textContent = number.format(top);
    figure.querySelector(".unit").textContent = unit;
    figure.querySelector(".from").textContent = clock.format(new Date(newest - span));
    figure.querySelector(".middle").textContent = clock.format(new Date(newest - span / 2));
    figure.querySelector(".to").textContent = `${clock.format(new Date(newest))} (now)`;
    const title = figure.querySelector("figcaption").firstChild.textContent.trim();
    svg.setAttribute("aria-label", `${title}: now ${now}; scale 0 to ${number.format(top)} ${unit}; the last ${Math.round(span / 1000)} s`);
    figure.querySelector("figcaption span").textContent = `now ${now}`;
  }

  // The axis' top: the next of 1, 2, 2.5, 5 x 10^n at or above the value.
  function niceCeiling(value) {
    const power = 10 ** Math.floor(Math.log10(value));
    return [1, 2, 2.5, 5, 10].map((step) => step * power).find((top) => top >= value);
  }

  document.getElementById("watch").addEventListener("submit", (event) => {
    event.preventDefault();
    const name = `${document.getElementById("watch-type").value}/${document.getElementById("watch-id").value}`;
    remember(name);
    if (!cards.has(name)) addCard(name);
  });

  refreshList();
  setInterval(refreshList, 5000);
  setInterval(() => { for (const card of cards.values()) sample(card); }, SAMPLE_MS);
})();
