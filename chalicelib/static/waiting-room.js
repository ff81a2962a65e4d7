// The waiting room's view, inlined into waiting-room.html by chalicelib/page.py. The queue's protocol (entering,
// the ticket kept, pacing, the line far back, back-off, buying once, leaving) is the client library's WaitingLine
// (clients/js/, loaded before this script as VirtualQueue: docs/clients.md); this script shows what it hears.
(function () {
  "use strict";
  const config = JSON.parse(document.getElementById("vq-config").textContent);
  const t = config.messages;
  const $ = (id) => document.getElementById(id);
  const locale = config.lang === "ko" ? "ko-KR" : "en";
  const clockFormat = new Intl.DateTimeFormat(locale, { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  const dateFormat = new Intl.DateTimeFormat(locale, { dateStyle: "medium", timeStyle: "short" });
  const SLOW_MS = 3000;  // a call still unanswered after this shows "reconnecting" while it waits

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
  let tokenExpiresAt = null;
  let opensAt = null;
  let retryAt = null;  // when a full line is tried again
  let lastGood = null;  // time of the last good answer
  let skewMs = 0;  // server clock minus ours, from the Date header
  let lastAnnounced = { position: null, at: 0 };
  let lookAgain = null;  // a line no operator opened yet: the next look

  function fill(text, values) {
    return text.replace(/\{(\w+)\}/g, (whole, name) => (name in values ? String(values[name]) : whole));
  }

  // What the view keeps of the place (the progress bar's start, the last place shown): the library keeps the place
  // itself. localStorage may refuse (private modes, quota): the page works without it, only forgetting on reload.
  let storage = null;
  try { storage = window.localStorage; } catch (err) { /* the library keeps the place in memory */ }
  const saved = {
    get(what) { try { return JSON.parse(storage.getItem(key(what))); } catch (err) { return null; } },
    set(what, value) { try { storage.setItem(key(what), JSON.stringify(value)); } catch (err) { /* see above */ } },
    drop(what) { try { storage.removeItem(key(what)); } catch (err) { /* see above */ } },
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

  // No JWT, an expired one, or one the queue refused: ask the shop for a new one through its login page, once; a
  // JWT that was refused straight after a login leaves the shopper a button instead, so a misconfigured login
  // cannot bounce them for ever.
  function signIn() {
    bearer = null;
    session.take("vq-jwt");
    line.stop();
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

  // The library's calls, watched for the view: one still unanswered after SLOW_MS shows "reconnecting" while it
  // waits, and each answer's Date header sets the clock of the countdowns.
  async function watchedFetch(url, init) {
    const slow = setTimeout(troubled, SLOW_MS);
    try {
      const response = await fetch(url, init);
      const date = Date.parse(response.headers.get("Date"));
      // The header has whole seconds: only a clock off by more than that is corrected.
      if (date && Math.abs(date - Date.now()) > 1500) skewMs = date - Date.now();
      return response;
    } finally {
      clearTimeout(slow);
    }
  }

  // The place in line: the library's, kept under this user's key. In jwt mode it asks for the JWT before each call;
  // after a 401 (`refresh`) there is no other to give: the queue's refusal ends the wait, and signIn asks for one.
  const line = new VirtualQueue.WaitingLine({
    baseUrl: new URL(config.base, location.href).href,
    type: config.queueType,
    targetId: config.targetId,
    ...(jwtMode ? { getToken: (refresh) => (refresh || expiredBearer() ? null : bearer) } : { userId }),
    storage: storage || undefined,
    storageKey: `vq:${config.queueType}:${config.targetId}:${userId}`,
    fetch: watchedFetch,
  });

  // --- connection trouble: a banner over the last view, while the library tries again with back-off ---

  function troubled() {
    const banner = $("trouble");
    $("last-update").textContent = lastGood ? fill(t.lastUpdate, { time: clockFormat.format(lastGood) }) : t.noUpdateYet;
    if (banner.hidden) {
      banner.hidden = false;
      document.body.classList.add("stale");
    }
  }

  function answered() {
    lastGood = new Date();
    $("trouble").hidden = true;
    document.body.classList.remove("stale");
  }

  // --- what the line hears ---

  function join() {
    clearTimeout(lookAgain);
    line.join().then((first) => (first === null ? boughtEarlier() : undefined), ended);
  }

  line.on("update", (update) => {
    answered();
    switch (update.state) {
      case "PRE_QUEUE":
        saved.set("last", { update, at: Date.now() });
        return showPreQueue(update);
      case "WAITING":
        saved.set("last", { update, at: Date.now() });
        return showPlace(update);
      case "SOLD_OUT":
        forgetPlace();
        return show("soldout");
      default:
        // A status this page does not know yet: stay neutral; the line keeps asking.
        return show("unknown");
    }
  });
  line.on("admitted", (admission) => {
    answered();
    showAdmitted(admission);
  });
  line.on("trouble", ({ error, retryInMs }) => {
    if (error.code !== "QUEUE_FULL") return troubled();
    answered();  // the queue's own answer: full for now, the line enters again when it said
    lineFull(retryInMs);
  });
  line.on("error", ended);

  // A refusal that ends the wait.
  function ended(error) {
    answered();
    switch (error.code) {
      case "UNAUTHENTICATED": return signIn();
      case "NOT_IN_QUEUE":
      case "INVALID_QUEUE_TICKET": forgetPlace(); return show("gone");
      case "NOT_INVITED": forgetPlace(); return show("notinvited");
      case "QUEUE_CLOSED": forgetPlace(); return show("closed");
      case "SOLD_OUT": forgetPlace(); return show("soldout");
      case "ALREADY_ADMITTED":
      case "IN_LINE_ELSEWHERE":
        // Header mode: another window or device holds this user's ticket, and with it the place.
        $("error-text").textContent = t.otherWindow;
        return show("error");
      case "UNKNOWN_TARGET":
        // Not opened by an operator (yet): look again now and then, so the page lets people in once it is.
        show("unopened");
        lookAgain = setTimeout(join, between(20000, 40000));
        return;
      default:
        $("error-text").textContent = fill(t.error_p, { code: error.code || error.status });
        return show("error");
    }
  }

  // The view's own memory of the place: dropped with it (the library drops the place itself).
  function forgetPlace() {
    saved.drop("start");
    saved.drop("last");
  }

  // --- the views ---

  function showPreQueue(entry) {
    opensAt = entry.opensAt ? Date.parse(entry.opensAt) || null : null;
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

  function showAdmitted(admission) {
    tokenExpiresAt = Date.parse(admission.expiresAt) || null;
    // Let in past no line: the queue is off for this user, or the target's safety net admitted them as they entered.
    $("turn").textContent = admission.direct ? t.direct_h : t.admitted_h;
    $("buy").disabled = false;
    $("buy").textContent = t.buy;
    $("buy-message").textContent = "";
    show("admitted");
    tick();
    $("buy").focus();
  }

  function showBought(order) {
    const name = $("name").textContent;
    $("bought-text").textContent = fill(order.already ? t.alreadyOrdered : t.bought_p, { name });
    $("order-number").textContent = order.orderId != null ? fill(t.orderNumber, { id: order.orderId }) : "";
    show("bought");
  }

  function lineFull(retryInMs) {
    retryAt = Date.now() + retryInMs;
    show("full");
    tick();
  }

  // Countdowns, once a second: the opening, the pass, the retry of a full line.
  function tick() {
    const view = document.body.dataset.view;
    if (view === "prequeue" && opensAt) {
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

  // The pass ran out (or the gate says it did): out of line, and the place forgotten, so Join again starts anew.
  function expired() {
    forgetPlace();
    line.leave().catch(() => {});
    show("expired");
  }

  // --- buying ---

  async function buy() {
    $("buy").disabled = true;
    $("buy").textContent = t.buying;
    $("buy-message").textContent = "";
    let purchase;
    try {
      purchase = await line.buy(config.purchasePath, { quantity: 1 });
    } catch (error) {
      return refusedPurchase(error);
    }
    answered();
    bought(purchase);
  }

  function refusedPurchase(error) {
    if (error.status) answered();
    if (!error.status || error.status >= 500 || error.code === "THROTTLED" || error.code === "UNEXPECTED_ANSWER") {
      // A failed purchase gives the pass back: the shop's trouble, or the gateway's (a 429 without a code: busy).
      $("buy").disabled = false;
      $("buy").textContent = t.buy;
      $("buy-message").textContent = error.code === "THROTTLED" ? t.busy : t.shopTrouble;
      return;
    }
    switch (error.code) {
      case "UNAUTHENTICATED": return signIn();
      case "SOLD_OUT": forgetPlace(); line.leave().catch(() => {}); return show("soldout");
      case "ALREADY_ORDERED": return showBought({ already: true });
      // Another window bought with this pass (an order of this one's the library answers without a call).
      case "ENTRY_TOKEN_USED": forgetPlace(); line.leave().catch(() => {}); return show("used");
      case "QUEUE_BYPASS_DENIED": return expired();
      default:
        $("refused-text").textContent = fill(t.refused, { code: error.code || error.status });
        return show("refused");
    }
  }

  // The order the library remembers: a reload shows it, not a Buy button for a pass already used.
  function bought(purchase) {
    forgetPlace();
    showBought({ orderId: purchase.body && purchase.body.orderId });
  }

  async function boughtEarlier() {
    bought(await line.buy(config.purchasePath));
  }

  function rejoin() {
    forgetPlace();
    lastAnnounced = { position: null, at: 0 };
    show("entering");
    line.leave().catch(() => {}).then(join);
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
  // A hidden tab's timers may be slowed to one a minute: back in view, far back, read the line at once.
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") line.wake();
  });
  $("buy").addEventListener("click", buy);
  for (const button of document.querySelectorAll(".rejoin")) button.addEventListener("click", rejoin);
  setInterval(tick, 1000);

  // The place this browser last showed, until the first answer (or, with the server down, marked as old).
  const last = saved.get("last");
  if (last && last.update) {
    lastGood = new Date(last.at);
    if (last.update.state === "WAITING") showPlace(last.update);
    else if (last.update.state === "PRE_QUEUE") showPreQueue(last.update);
  }
  if (jwtMode && expiredBearer()) signIn();
  else join();
})();
