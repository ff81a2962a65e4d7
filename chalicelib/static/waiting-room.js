// The waiting room's behaviour, inlined into waiting-room.html by chalicelib/page.py (one request per page).
(function () {
  "use strict";
  const config = JSON.parse(document.getElementById("vq-config").textContent);
  const t = config.messages;
  const $ = (id) => document.getElementById(id);
  const entriesUrl = new URL(config.entries, location.href);
  const statusUrl = new URL(config.entries + "/me", location.href);
  const lineUrl = new URL(config.line, location.href);
  const purchaseUrl = new URL(config.purchase, location.href);
  const locale = config.lang === "ko" ? "ko-KR" : "en";
  const clockFormat = new Intl.DateTimeFormat(locale, { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  const dateFormat = new Intl.DateTimeFormat(locale, { dateStyle: "medium", timeStyle: "short" });
  const CALL_TIMEOUT_MS = 8000;  // a hung API: give up on the call and try again
  const SLOW_MS = 3000;  // a call still unanswered after this shows "reconnecting" while it waits
  const THROTTLED_MS = 5000;  // the gateway's 429 (no code): the shortest wait before asking again, doubled each time

  // How the shopper is named (docs/identity.md: the page): a verified JWT the shop hands over, or, in header mode
  // (the demo, or behind the shop's own gateway), X-User-Id.
  const jwtMode = config.identity.mode === "jwt";
  // This tab's session storage (the JWT, the sign-in's state). It may refuse: then nothing is kept.
  const session = {
    get(name) { try { return sessionStorage.getItem(name); } catch (err) { return null; } },
    set(name, value) { try { sessionStorage.setItem(name, value); } catch (err) { /* not kept */ } },
    take(name) {
      const value = session.get(name);
      try { sessionStorage.removeItem(name); } catch (err) { /* nothing kept */ }
      return value;
    },
  };
  const handed = jwtMode ? takeToken() : { token: null, now: false };
  let bearer = handed.token;
  const userId = jwtMode ? String((claims(bearer) || {})[config.identity.userClaim] || "signed-in") : chooseUser();
  const key = (what) => `vq-${what}:${config.queueType}:${config.targetId}:${userId}`;
  let pollTimer = null;  // the one pending poll or retry
  let entryToken = null;
  let tokenExpiresAt = null;
  let opensAt = null;
  let retryAt = null;  // when a full line is tried again
  let lastGood = null;  // time of the last good answer
  let failures = 0;
  let skewMs = 0;  // server clock minus ours, from the Date header
  let lastAnnounced = { position: null, at: 0 };
  let lastAdviceMs = 0;  // the last wait the server advised (pollAfterMs, lineAfterMs)
  // Beyond the presence window: {seq, line, ahead, offset}, the place read off the line's public state
  // (docs/api.md#far-back-read-the-line-not-your-place); null while polling its own place.
  let far = null;

  function fill(text, values) {
    return text.replace(/\{(\w+)\}/g, (whole, name) => (name in values ? String(values[name]) : whole));
  }

  // localStorage may refuse (private modes, quota): the page works without it, only forgetting on reload.
  const saved = {
    get(what) { try { return JSON.parse(localStorage.getItem(key(what))); } catch (err) { return null; } },
    set(what, value) { try { localStorage.setItem(key(what), JSON.stringify(value)); } catch (err) { /* see above */ } },
    drop(what) { try { localStorage.removeItem(key(what)); } catch (err) { /* see above */ } },
  };

  // The shop's sign-in hands the JWT in the fragment (#token=...&state=...), which no request carries. It is taken
  // only with the state this tab drew before sending the shopper there (`loginAddress`; checked and cleared), as
  // OAuth does: a link carrying someone else's JWT, to make the shopper queue and buy as them, is ignored. Kept for
  // this tab only (sessionStorage), and out of the address bar at once, so it is neither bookmarked nor shared
  // with the link. `now`: this load is the sign-in's answer (it carries a state), so a refusal shows a button
  // instead of sending the shopper straight back.
  function takeToken() {
    const fragment = new URLSearchParams(location.hash.slice(1));
    const token = fragment.get("token");
    const state = fragment.get("state");
    if (token || state) {
      fragment.delete("token");
      fragment.delete("state");
      const rest = fragment.toString();
      history.replaceState(history.state, "", location.pathname + location.search + (rest ? "#" + rest : ""));
    }
    if (token && state && session.take("vq-login-state") === state) session.set("vq-jwt", token);
    return { token: session.get("vq-jwt"), now: Boolean(token && state) };
  }

  // The shop's sign-in (VQ_LOGIN_URL, `{return}` in it replaced by this page's address), with `state=`: a random
  // value this tab keeps, which the sign-in hands back beside the JWT (docs/identity.md: the page).
  function loginAddress(login) {
    const state = Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
    session.set("vq-login-state", state);
    const url = new URL(login.replace("{return}", encodeURIComponent(location.href)), location.href);
    url.search = (url.search ? url.search + "&" : "?") + "state=" + state;
    return url.href;
  }

  // The JWT's claims, read (not verified: the server does that) for its expiry and the user it names.
  function claims(token) {
    try {
      const part = atob(token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/"));
      return JSON.parse(new TextDecoder().decode(Uint8Array.from(part, (c) => c.charCodeAt(0))));
    } catch (err) {
      return null;
    }
  }

  function identityHeaders() {
    return jwtMode ? { Authorization: `Bearer ${bearer}` } : { "X-User-Id": userId };
  }

  // No JWT, an expired one, or one the queue refused: ask the shop for a new one through its login page, once; a
  // JWT that was refused straight after a login leaves the shopper a button instead, so a misconfigured login
  // cannot bounce them for ever.
  function signIn() {
    bearer = null;
    session.take("vq-jwt");
    clearTimeout(pollTimer);
    const login = config.identity.loginUrl;
    const target = login ? loginAddress(login) : null;
    if (target && !handed.now) {
      location.assign(target);
      return;
    }
    const button = $("signin");
    button.hidden = !target;
    if (target) button.onclick = () => location.assign(target);
    show("signin");
  }

  function expiredBearer() {
    const exp = Number((claims(bearer) || {}).exp);
    return !bearer || (Number.isFinite(exp) && exp * 1000 <= serverNow());
  }

  function chooseUser() {
    // Header mode's stand-in for the shop's login: ?user=42, else a random id kept per browser.
    let id = null;
    try {
      const asked = new URLSearchParams(location.search).get("user");
      if (asked && /^[\x21-\x7e]{1,128}$/.test(asked)) localStorage.setItem("vq-user-id", asked);
      else if (!localStorage.getItem("vq-user-id")) localStorage.setItem("vq-user-id", String(1 + Math.floor(Math.random() * 1e12)));
      id = localStorage.getItem("vq-user-id");
    } catch (err) { /* no storage */ }
    return id || String(1 + Math.floor(Math.random() * 1e12));
  }

  function show(view) {
    if (document.body.dataset.view === view) return;
    document.body.dataset.view = view;
    let heading = null;
    for (const section of document.querySelectorAll("section[data-view]")) {
      section.hidden = section.dataset.view !== view;
      if (!section.hidden) heading = section.querySelector("h2");
    }
    if (heading) say(heading.textContent.trim());
  }

  function say(text) {
    $("announce").textContent = text;
  }

  const serverNow = () => Date.now() + skewMs;
  const between = (low, high) => low + Math.random() * (high - low);
  function later(next, ms) {
    clearTimeout(pollTimer);
    pollTimer = setTimeout(next, ms);
  }

  async function call(method, url, headers, body) {
    const controller = new AbortController();
    const abort = setTimeout(() => controller.abort(), CALL_TIMEOUT_MS);
    const slow = setTimeout(troubled, SLOW_MS);
    try {
      const response = await fetch(url, { method, headers, body, cache: "no-store", signal: controller.signal });
      const text = await response.text();
      let json = null;
      try { json = JSON.parse(text); } catch (err) { /* not JSON: a gateway's or proxy's page */ }
      const date = Date.parse(response.headers.get("Date"));
      // The header has whole seconds: only a clock off by more than that is corrected.
      if (date && Math.abs(date - Date.now()) > 1500) skewMs = date - Date.now();
      const retryAfter = Number(response.headers.get("Retry-After")) || 0;
      return { status: response.status, body: json, code: json && json.code, retryAfter };
    } finally {
      clearTimeout(abort);
      clearTimeout(slow);
    }
  }

  // --- connection trouble: a banner over the last view, retried with backoff until an answer comes ---

  function troubled() {
    const banner = $("trouble");
    $("last-update").textContent = lastGood ? fill(t.lastUpdate, { time: clockFormat.format(lastGood) }) : t.noUpdateYet;
    if (banner.hidden) {
      banner.hidden = false;
      document.body.classList.add("stale");
    }
  }

  function retry(next, retryAfterS) {
    failures += 1;
    troubled();
    const backoff = Math.min(15000, 1000 * 2 ** Math.min(failures - 1, 4));
    later(next, retryAfterS ? retryAfterS * 1000 + between(0, 1000) : between(backoff / 2, backoff));
  }

  // A 429 without a code: the gateway says slow down. Never sooner than the server last advised, nor than
  // THROTTLED_MS doubled per refusal in a row, shortened by up to a tenth so the throttled spread out.
  function throttled(next) {
    failures += 1;
    troubled();
    const backoff = Math.min(60000, THROTTLED_MS * 2 ** Math.min(failures - 1, 4));
    later(next, Math.max(lastAdviceMs, backoff) * (1 - 0.1 * Math.random()));
  }
  const throttledAnswer = (answer) => answer.status === 429 && !answer.code && !answer.retryAfter;

  function answered() {
    failures = 0;
    lastGood = new Date();
    $("trouble").hidden = true;
    document.body.classList.remove("stale");
  }

  // An answer the queue gives (JSON with a code), not a gateway or network failure.
  const fromQueue = (answer) => answer.status < 500 && answer.code;

  // --- entering and polling ---

  async function enter() {
    if (jwtMode && expiredBearer()) return signIn();
    let answer;
    try {
      answer = await call("POST", entriesUrl, identityHeaders());
    } catch (err) {
      return retry(enter);
    }
    if (answer.status === 200 && answer.body) {
      answered();
      if (answer.body.queueTicket) saved.set("ticket", answer.body.queueTicket);
      return handle(answer.body);
    }
    if (throttledAnswer(answer)) return throttled(enter);
    if (!fromQueue(answer)) return retry(enter, answer.retryAfter);
    answered();
    if (answer.status === 429) return lineFull(answer.retryAfter || 10);
    refused(answer, enter);
  }

  async function poll() {
    const ticket = saved.get("ticket");
    if (!ticket) return enter();
    if (jwtMode && expiredBearer()) return signIn();
    let answer;
    try {
      answer = await call("GET", statusUrl, { ...identityHeaders(), "X-Queue-Ticket": ticket });
    } catch (err) {
      return retry(poll);
    }
    if (answer.status === 200 && answer.body) {
      answered();
      return handle(answer.body);
    }
    if (throttledAnswer(answer)) return throttled(poll);
    if (!fromQueue(answer)) return retry(poll, answer.retryAfter);
    answered();
    if (answer.code === "NOT_IN_QUEUE" || answer.code === "INVALID_QUEUE_TICKET") {
      forgetPlace();
      return show("gone");
    }
    refused(answer, poll);
  }

  // A refusal by the queue (4xx with a code) on enter or poll.
  function refused(answer, next) {
    switch (answer.code) {
      case "UNAUTHENTICATED": return signIn();
      case "NOT_INVITED": forgetPlace(); return show("notinvited");
      case "QUEUE_CLOSED": forgetPlace(); return show("closed");
      case "SOLD_OUT": forgetPlace(); return show("soldout");
      case "ALREADY_ADMITTED":
        // Header mode hands an admitted user's pass only to a poll with their ticket (docs/identity.md).
        if (saved.get("ticket")) return poll();
        $("error-text").textContent = t.otherWindow;
        return show("error");
      case "UNKNOWN_TARGET":
        // Not opened by an operator (yet): look again now and then, so the page lets people in once it is.
        show("unopened");
        return later(next, between(20000, 40000));
      default:
        $("error-text").textContent = fill(t.error_p, { code: answer.code || answer.status });
        return show("error");
    }
  }

  function handle(entry) {
    if (entry.status === "WAITING" || entry.status === "PRE_QUEUE") saved.set("last", { entry, at: Date.now() });
    switch (entry.status) {
      case "PRE_QUEUE":
        far = null;
        showPreQueue(entry);
        lastAdviceMs = nextPoll(entry);
        return later(poll, lastAdviceMs);
      case "WAITING":
        if (!saved.get("ticket")) {
          $("error-text").textContent = t.otherWindow;
          return show("error");
        }
        showPlace(entry);
        lastAdviceMs = nextPoll(entry);
        // Far back: read the line (the edge answers it), not the place; no heartbeat is needed there.
        far = entry.lineAfterMs != null && entry.seq ? { seq: entry.seq, line: null } : null;
        return later(far ? readLine : poll, lastAdviceMs);
      case "ADMITTED":
      case "DIRECT_ADMITTED":
        return showAdmitted(entry);
      case "SOLD_OUT":
        forgetPlace();
        return show("soldout");
      default:
        // A status this page does not know yet: stay neutral and keep asking.
        show("unknown");
        return later(poll, nextPoll(entry));
    }
  }

  // The server paces polls (pollAfterMs); without it, every 2-3 s, or before a scheduled opening, around it.
  function nextPoll(entry) {
    const advised = Number(entry.pollAfterMs);
    if (entry.pollAfterMs != null && Number.isFinite(advised) && advised >= 0) return Math.min(Math.max(advised, 250), 120000);
    if (entry.status === "PRE_QUEUE" && opensAt) {
      return Math.min(Math.max(opensAt - serverNow(), 0), 20000) + between(500, 2500);
    }
    return between(2000, 3000);
  }

  // --- far back: the line's public state ---

  async function readLine() {
    let answer;
    try {
      answer = await call("GET", lineUrl, {});
    } catch (err) {
      return poll();
    }
    if (throttledAnswer(answer)) return throttled(readLine);
    const line = answer.status === 200 && answer.body;
    // Any other answer (not ticked yet, Redis down and no copy at the edge): ask for the place itself.
    if (!far || !line || !Array.isArray(line.shape)) return poll();
    answered();
    far.line = line;
    far.offset = Number(line.serverTimeMs) - Date.now();
    far.ahead = aheadOf(far.seq, line);
    placeFar(true);
  }

  // Users ahead of `seq`: interpolated between the two points of the line's shape around it (within 1 % of it).
  function aheadOf(seq, line) {
    const mine = Number(seq);
    const points = line.shape;
    if (mine <= Number(line.mark) || !points.length || mine <= Number(points[0][0])) return 0;
    for (let i = 1; i < points.length; i++) {
      const [s2, a2] = [Number(points[i][0]), points[i][1]];
      if (mine <= s2) {
        const [s1, a1] = [Number(points[i - 1][0]), points[i - 1][1]];
        return a1 + (a2 - a1) * (mine - s1) / (s2 - s1);
      }
    }
    return Number(line.waitingCount);
  }

  // The place now: moved on at the line's rate since the pump wrote it; then poll inside the window, or read the
  // line again after half the wait until the window (at most readCapS apart). `read`: just read.
  function placeFar(read) {
    const line = far.line;
    const paused = line.state === "PAUSED";
    const moving = (line.state === "OPEN" || line.state === "CLOSED") && line.ratePerSec > 0;
    if (!paused && !moving) return poll();  // sold out, before or at the opening: the place's own answer says
    const elapsed = Math.max(0, Date.now() + far.offset - line.asOfMs) / 1000;
    const ahead = Math.max(0, far.ahead - (paused ? 0 : line.ratePerSec * elapsed));
    const eta = paused ? null : ahead / line.ratePerSec;
    if (!paused && eta <= line.presenceWindowS) {
      far = null;
      return poll();
    }
    showPlace({ position: Math.round(ahead) + 1, aheadCount: Math.round(ahead), etaSeconds: paused ? null : Math.round(eta), paused });
    if (!read) return;
    const waitS = paused ? line.readCapS : Math.min(line.readCapS, Math.max(1, (eta - line.presenceWindowS) / 2));
    lastAdviceMs = waitS * 1000 * (1 - 0.1 * Math.random());
    later(readLine, lastAdviceMs);
  }

  function forgetPlace() {
    saved.drop("ticket");
    saved.drop("start");
    saved.drop("last");
  }

  // --- the views ---

  function showPreQueue(entry) {
    opensAt = entry.opensAt ? Date.parse(entry.opensAt) : null;
    $("opens-at").textContent = opensAt ? fill(t.opensAt, { time: dateFormat.format(opensAt) }) : "";
    // The commitment to the draw's seed, as it was when the page loaded (docs/guarantees.md#the-opening-draw).
    $("commitment").hidden = !config.openingCommitment;
    $("commitment").textContent = config.openingCommitment ? fill(t.commitment, { hash: config.openingCommitment }) : "";
    show("prequeue");
    tick();
  }

  function showPlace(entry) {
    opensAt = null;
    const ahead = Number(entry.aheadCount) || 0;
    // People ahead at the first answer: where the progress bar starts. Kept, so a reload does not reset it.
    let start = saved.get("start");
    if (!(start >= ahead)) {
      start = ahead;
      saved.set("start", start);
    }
    const done = start === 0 ? 100 : Math.round(100 * (start - ahead) / start);
    $("position").textContent = entry.position != null ? entry.position.toLocaleString(locale) : "–";
    $("ahead").textContent = ahead.toLocaleString(locale);
    $("eta").textContent = entry.paused ? "–" : formatEta(entry.etaSeconds, entry.etaLowSeconds, entry.etaHighSeconds);
    $("progress").style.width = `${done}%`;
    $("bar").setAttribute("aria-valuenow", String(done));
    $("paused").hidden = !entry.paused;
    $("waiting-note").hidden = Boolean(entry.paused);
    show("waiting");
    // Politely, and not on every poll: a screen reader hears the place when it changes, at most every 15 s.
    if (entry.position !== lastAnnounced.position && Date.now() - lastAnnounced.at > 15000) {
      lastAnnounced = { position: entry.position, at: Date.now() };
      say(fill(t.announcePlace, { position: entry.position, ahead }));
    }
  }

  // The range the wait is expected in ("about 4-6 min"); etaSeconds alone from a server without one.
  function formatEta(seconds, low, high) {
    const known = (value) => value != null && Number.isFinite(Number(value));
    if (!known(low) || !known(high)) {
      if (!known(seconds)) return "–";
      return seconds < 90 ? fill(t.etaSeconds, { n: seconds }) : fill(t.etaMinutes, { n: Math.round(seconds / 60) });
    }
    if (high < 90) return low === high ? fill(t.etaSeconds, { n: high }) : fill(t.etaRangeSeconds, { low, high });
    const [lowMin, highMin] = [Math.max(1, Math.floor(low / 60)), Math.ceil(high / 60)];
    return lowMin === highMin ? fill(t.etaMinutes, { n: highMin }) : fill(t.etaRangeMinutes, { low: lowMin, high: highMin });
  }

  function showAdmitted(entry) {
    entryToken = entry.entryToken;
    tokenExpiresAt = Date.parse(entry.tokenExpiresAt) || null;
    // Let in past no line: the queue is off for this user, or the target's safety net admitted them as they entered.
    $("turn").textContent = entry.status === "DIRECT_ADMITTED" || entry.queued === false ? t.direct_h : t.admitted_h;
    $("buy").disabled = false;
    $("buy").textContent = t.buy;
    $("buy-message").textContent = "";
    clearTimeout(pollTimer);
    show("admitted");
    tick();
    $("buy").focus();
  }

  function showBought(order) {
    const name = $("name").textContent;
    $("bought-text").textContent = fill(order.already ? t.alreadyOrdered : t.bought_p, { name });
    $("order-number").textContent = order.orderId != null ? fill(t.orderNumber, { id: order.orderId }) : "";
    clearTimeout(pollTimer);
    show("bought");
  }

  function lineFull(seconds) {
    retryAt = Date.now() + seconds * 1000;
    show("full");
    tick();
    later(enter, seconds * 1000 + between(0, 1000));
  }

  // Countdowns, once a second: the opening, the pass, the retry of a full line.
  function tick() {
    const view = document.body.dataset.view;
    if (view === "waiting" && far && far.line) {
      placeFar(false);
    } else if (view === "prequeue" && opensAt) {
      const left = opensAt - serverNow();
      $("opens-in").textContent = left > 0 ? clock(left) : "0:00";
      $("prequeue-note").textContent = left > 0 ? t.prequeue_p : t.opening;
    } else if (view === "admitted" && tokenExpiresAt) {
      const left = tokenExpiresAt - serverNow();
      if (left <= 0) return expired();
      $("pass-left").textContent = fill(t.passLeft, { time: clock(left) });
    } else if (view === "full" && retryAt) {
      $("full-text").textContent = fill(t.full_p, { n: Math.max(0, Math.ceil((retryAt - Date.now()) / 1000)) });
    }
  }

  function clock(ms) {
    const total = Math.ceil(ms / 1000);
    const h = Math.floor(total / 3600), m = Math.floor(total / 60) % 60, s = total % 60;
    const mmss = `${String(m).padStart(h ? 2 : 1, "0")}:${String(s).padStart(2, "0")}`;
    return h ? `${h}:${mmss}` : mmss;
  }

  function expired() {
    entryToken = null;
    forgetPlace();
    show("expired");
  }

  // --- buying ---

  async function buy() {
    $("buy").disabled = true;
    $("buy").textContent = t.buying;
    $("buy-message").textContent = "";
    let answer;
    try {
      answer = await call("POST", purchaseUrl, {
        ...identityHeaders(), "X-Entry-Token": entryToken, "Content-Type": "application/json",
      }, JSON.stringify({ quantity: 1 }));
    } catch (err) {
      answer = null;
    }
    if (answer) answered();
    if (answer && answer.status >= 200 && answer.status < 300) {
      return bought({ orderId: answer.body && answer.body.orderId });
    }
    if (!answer || !fromQueue(answer)) {
      // A failed purchase gives the pass back: the shop's trouble, or the gateway's (a 429 without a code: busy).
      $("buy").disabled = false;
      $("buy").textContent = t.buy;
      $("buy-message").textContent = answer && answer.status === 429 ? t.busy : t.shopTrouble;
      return;
    }
    switch (answer.code) {
      case "UNAUTHENTICATED": return signIn();
      case "SOLD_OUT": forgetPlace(); return show("soldout");
      case "ALREADY_ORDERED": return bought({ already: true });
      case "ENTRY_TOKEN_USED": return saved.get("order") ? showBought(saved.get("order")) : show("used");
      case "QUEUE_BYPASS_DENIED": return expired();
      default:
        $("refused-text").textContent = fill(t.refused, { code: answer.code || answer.status });
        return show("refused");
    }
  }

  function bought(order) {
    // Remembered, so that a reload shows the order, not a Buy button for a pass already used.
    saved.set("order", order);
    forgetPlace();
    showBought(order);
  }

  function rejoin() {
    forgetPlace();
    lastAnnounced = { position: null, at: 0 };
    show("entering");
    enter();
  }

  if (config.imageUrl) {
    const picture = $("picture");
    picture.addEventListener("load", () => { picture.hidden = false; $("placeholder").remove(); });
    picture.src = config.imageUrl;
  }
  const language = $("language");
  const here = new URL(location.href);
  here.searchParams.set("lang", language.getAttribute("lang"));
  language.href = here.search;
  // Where supported (https, or this machine), a reload while the server is down still shows the page.
  if ("serviceWorker" in navigator) navigator.serviceWorker.register(new URL(config.serviceWorker, location.href)).catch(() => {});
  // A hidden tab's timers may be slowed to one a minute: back in view, ask at once rather than at the next one.
  document.addEventListener("visibilitychange", () => {
    const polling = ["prequeue", "waiting", "unknown"].includes(document.body.dataset.view);
    if (document.visibilityState === "visible" && polling) later(far ? readLine : poll, 0);
  });
  $("buy").addEventListener("click", buy);
  for (const button of document.querySelectorAll(".rejoin")) button.addEventListener("click", rejoin);
  setInterval(tick, 1000);

  const order = saved.get("order");
  const last = saved.get("last");
  if (order) {
    showBought(order);
  } else {
    // The place this browser last heard, shown until the first answer (or, with the server down, marked as old).
    if (last && saved.get("ticket")) {
      lastGood = new Date(last.at);
      if (last.entry.status === "WAITING") showPlace(last.entry);
      else if (last.entry.status === "PRE_QUEUE") showPreQueue(last.entry);
    }
    enter();
  }
})();
