// One shopper's place in one line: enter, poll as the server paces, buy once, leave (docs/api.md, docs/clients.md).

import { QueueError } from "./errors.js";
import { movedSince, nextReadMs, placeIn, readLineState, type LineState, type Placement } from "./far.js";
import { MIN_POLL_MS, parseRetryAfter, pollDelay, retryDelay } from "./pacing.js";
import { Kept, memoryStorage, type TicketStorage } from "./storage.js";

export type EntryStatus = "PRE_QUEUE" | "WAITING" | "ADMITTED" | "DIRECT_ADMITTED" | "SOLD_OUT";

/** The place as the last answer gave it (fields the answer lacked are null). */
export interface Update {
  state: EntryStatus | string;
  position: number | null;
  aheadCount: number | null;
  etaSeconds: number | null;
  etaLowSeconds: number | null;
  etaHighSeconds: number | null;
  paused: boolean;
  opensAt: string | null;
  /** When the next poll goes out, as the server advised. */
  pollAfterMs: number | null;
  /** Far back: worked out here from the line's public state (`/line`), not answered for this entry. */
  fromLine: boolean;
}

/** The turn: buy with `line.buy` before `expiresAt`. `direct`: let in past no line (queue off, or an outage). */
export interface Admission {
  entryToken: string;
  expiresAt: string | null;
  direct: boolean;
}

/** A failure the line is riding out (no answer, 429, 503, 5xx): it tries again in `retryInMs`. */
export interface Trouble {
  error: QueueError;
  failures: number;
  retryInMs: number;
}

export interface Purchase {
  status: number;
  body: unknown;
  /** True when this order was made earlier (remembered in storage) and nothing was sent now. */
  remembered: boolean;
}

/** The timers the line uses; tests give it a fake one. */
export interface Clock {
  now(): number;
  setTimeout(callback: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export interface WaitingLineOptions {
  /** Where the API is: "https://shop.example/api" deployed (the stage prefix), "http://127.0.0.1:8000" locally. */
  baseUrl: string;
  type: string;
  targetId: string | number;
  /** jwt mode: the shop's JWT for this shopper; called before each call, with `refresh` true after a 401 (null
   * then: the 401 stands, an UNAUTHENTICATED error). */
  getToken?: (refresh: boolean) => string | null | Promise<string | null>;
  /** Header mode (behind the shop's gateway, or `make run`): the user, sent as X-User-Id. */
  userId?: string;
  /** Default: memory (no resume after a restart). `localStorage`, AsyncStorage, or any of that shape. */
  storage?: TicketStorage;
  /** Default: "vq:<type>:<targetId>:<userId or 'me'>". */
  storageKey?: string;
  /** Give up on a call after this long and treat it as unanswered (default 8 s). */
  callTimeoutMs?: number;
  fetch?: typeof fetch;
  clock?: Clock;
  random?: () => number;
}

type Events = {
  update: Update;
  admitted: Admission;
  trouble: Trouble;
  /** A refusal that ends the wait (sold out, closed, not in the line any more...): polling stops. */
  error: QueueError;
};

interface Answer {
  status: number;
  body: Json | null;
  code: string | null;
  retryAfterMs: number | null;
}
type Json = { [field: string]: unknown };

const realClock: Clock = {
  now: () => Date.now(),
  setTimeout: (callback, ms) => setTimeout(callback, ms),
  clearTimeout: (handle) => clearTimeout(handle as ReturnType<typeof setTimeout>),
};

export class WaitingLine {
  private readonly options: WaitingLineOptions;
  private readonly record: Kept;
  private readonly clock: Clock;
  private readonly random: () => number;
  private readonly fetch: typeof fetch;
  private readonly listeners = new Map<keyof Events, Set<(value: never) => void>>();
  private readonly entries: string;
  private readonly lineUrl: string;
  private seq: string | null = null; // far back: this entry's seq, placed in the line's shape
  private farBack = false; // the next call is a read of /line
  private timer: unknown = null;
  private run = 0; // bumped by stop(): an answer to an earlier run's call is dropped
  private failures = 0;
  private advisedMs: number | null = null;
  private settle: ((value: Update | Admission | null, error?: QueueError) => void) | null = null;

  constructor(options: WaitingLineOptions) {
    this.options = options;
    this.clock = options.clock ?? realClock;
    this.random = options.random ?? Math.random;
    this.fetch = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
    const base = options.baseUrl.replace(/\/+$/, "");
    this.entries = `${base}/virtual-queues/${encodeURIComponent(options.type)}/${encodeURIComponent(String(options.targetId))}/entries`;
    this.lineUrl = this.entries.replace(/\/entries$/, "/line");
    const key = options.storageKey ?? `vq:${options.type}:${options.targetId}:${options.userId ?? "me"}`;
    this.record = new Kept(options.storage ?? memoryStorage(), key);
  }

  /** Listen to an event; the function returned stops listening. */
  on<E extends keyof Events>(event: E, listener: (value: Events[E]) => void): () => void {
    const set = this.listeners.get(event) ?? new Set();
    this.listeners.set(event, set.add(listener));
    return () => void set.delete(listener);
  }

  /**
   * Take a place, or resume the one storage kept (its ticket polled, its token handed over again), and keep it:
   * polls follow until the turn comes. Resolves with the first answer (an Update or the Admission; null once
   * bought earlier); rejects with a QueueError when the queue refuses (sold out, closed, not invited...).
   * Failures on the way (no answer, 429, 503) are ridden out with back-off ("trouble" events), not thrown.
   */
  join(): Promise<Update | Admission | null> {
    this.stop();
    const run = this.run;
    const first = new Promise<Update | Admission | null>((resolve, reject) => {
      this.settle = (value, error) => {
        this.settle = null;
        if (error) reject(error);
        else resolve(value);
      };
    });
    void this.record.read().then((saved) => {
      if (run !== this.run) return;
      if (saved.order) return this.settle?.(null);
      if (saved.entryToken && !this.expired(saved.expiresAt)) return this.admitted(saved.entryToken, saved.expiresAt ?? null, Boolean(saved.direct));
      return saved.ticket ? this.poll(run) : this.enter(run);
    });
    return first;
  }

  /**
   * Buy with the entry token: POST `path` (such as "/limited-drops/1/orders") with `body` as JSON. The gate takes
   * the token once and gives the shop its Idempotency-Key; a success is remembered, and buying again answers it
   * without a call. A failure throws a QueueError; one without an answer (NETWORK) or the shop's (502, 504) leaves
   * the token usable, so buying again is safe.
   */
  async buy(path: string, body: unknown = {}): Promise<Purchase> {
    const saved = await this.record.read();
    if (saved.order) return { ...saved.order, remembered: true };
    if (!saved.entryToken) throw new QueueError(0, "NOT_ADMITTED", "no entry token yet: wait for the admitted event");
    const url = this.options.baseUrl.replace(/\/+$/, "") + path;
    const answer = await this.call("POST", url, { "X-Entry-Token": saved.entryToken, "Content-Type": "application/json" }, JSON.stringify(body));
    if (answer.status >= 200 && answer.status < 300) {
      const order = { status: answer.status, body: answer.body };
      await this.record.write({ order });
      return { ...order, remembered: false };
    }
    throw failure(answer);
  }

  /** Step out of the line (an unused token is revoked) and forget the place. */
  async leave(): Promise<void> {
    this.stop();
    const saved = await this.record.read();
    if (saved.ticket) {
      const answer = await this.call("DELETE", `${this.entries}/me`, { "X-Queue-Ticket": saved.ticket });
      // 403/404: gone already (left, evicted, an earlier entry's ticket): as good as left.
      if (answer.status !== 204 && answer.status !== 403 && answer.status !== 404) throw failure(answer);
    }
    await this.record.clear();
  }

  /** Back in the foreground (an app's AppState, a page's visibilitychange): far back, read the line at once. */
  wake(): void {
    if (this.farBack) this.later(() => this.readLine(this.run), 0);
  }

  /** Stop polling; storage keeps the place, so a later `join()` (or the app's next start) resumes it. */
  stop(): void {
    this.run += 1;
    if (this.timer !== null) this.clock.clearTimeout(this.timer);
    this.timer = null;
    this.failures = 0;
    this.farBack = false;
  }

  // --- entering and polling ---

  private async enter(run: number): Promise<void> {
    const answer = await this.call("POST", this.entries, {});
    if (run !== this.run) return;
    if (answer.status === 200 && answer.body) {
      const ticket = answer.body.queueTicket;
      const kept = typeof ticket === "string" ? await this.record.change({ ticket }) : await this.record.read();
      if (run !== this.run) return;
      if (!kept.ticket && ["WAITING", "PRE_QUEUE"].includes(String(answer.body.status))) {
        // Header mode hands the ticket to the first entry only: another device or window holds this place.
        return this.end(new QueueError(200, "IN_LINE_ELSEWHERE", "in line already, from a window or device whose ticket this one lacks"));
      }
      return this.handle(answer.body, run);
    }
    if (answer.code === "ALREADY_ADMITTED" && (await this.record.read()).ticket) return this.poll(run);
    this.failed(answer, () => this.enter(run));
  }

  private async poll(run: number): Promise<void> {
    const { ticket } = await this.record.read();
    if (!ticket) return this.enter(run);
    const answer = await this.call("GET", `${this.entries}/me`, { "X-Queue-Ticket": ticket });
    if (run !== this.run) return;
    if (answer.status === 200 && answer.body) return this.handle(answer.body, run);
    if (answer.code === "NOT_IN_QUEUE" || answer.code === "INVALID_QUEUE_TICKET") await this.record.clear();
    this.failed(answer, () => this.poll(run));
  }

  private async handle(entry: Json, run: number): Promise<void> {
    this.failures = 0;
    const state = String(entry.status);
    if ((state === "ADMITTED" || state === "DIRECT_ADMITTED") && typeof entry.entryToken === "string") {
      const expiresAt = typeof entry.tokenExpiresAt === "string" ? entry.tokenExpiresAt : null;
      const direct = state === "DIRECT_ADMITTED" || entry.queued === false;
      await this.record.change({ entryToken: entry.entryToken, expiresAt, direct });
      if (run === this.run) this.admitted(entry.entryToken, expiresAt, direct);
      return;
    }
    const update = toUpdate(entry);
    if (state === "SOLD_OUT") {
      await this.record.clear();
      if (run !== this.run) return;
      this.emit("update", update);
      return this.settle?.(update);
    }
    this.emit("update", update);
    this.settle?.(update);
    const lineAfterMs = typeof entry.lineAfterMs === "number" && Number.isFinite(entry.lineAfterMs) ? entry.lineAfterMs : null;
    if (state === "WAITING" && lineAfterMs !== null && typeof entry.seq === "string") {
      // Far back: read the line's public state next, not this place (docs/api.md).
      this.seq = entry.seq;
      this.advisedMs = lineAfterMs;
      this.farBack = true;
      return this.later(() => this.readLine(run), Math.max(lineAfterMs, MIN_POLL_MS));
    }
    this.farBack = false;
    this.advisedMs = update.pollAfterMs;
    const opensAt = update.opensAt ? Date.parse(update.opensAt) : NaN;
    const delay = pollDelay(entry.pollAfterMs, Number.isNaN(opensAt) ? null : opensAt, this.clock.now(), this.random);
    this.later(() => this.poll(run), delay);
  }

  // --- far back: the line's public state, and the place worked out from it (docs/api.md, steps 1-6) ---

  private async readLine(run: number): Promise<void> {
    this.farBack = false;
    const answer = await this.send("GET", this.lineUrl, {}); // no identity: one cached answer for everyone
    if (run !== this.run) return;
    if (answer.status === 429 && !answer.code) {
      // The edge's throttle: slow down on the line itself, rather than move the load onto the origin.
      this.failures += 1;
      const retryInMs = retryDelay(this.failures, answer.retryAfterMs, this.advisedMs, this.random, true);
      this.emit("trouble", { error: failure(answer), failures: this.failures, retryInMs });
      this.farBack = true;
      return this.later(() => this.readLine(run), retryInMs);
    }
    const line = answer.status === 200 ? readLineState(answer.body) : null;
    // Any other answer, a line that no longer moves for us, or our turn: ask for our own place now.
    if (!line || this.seq === null || ["SOLD_OUT", "PRE_QUEUE", "OPENING"].includes(line.state)) return this.poll(run);
    this.failures = 0;
    const placed = placeIn(line, this.seq);
    if (placed.turnCame) return this.poll(run);
    const offset = line.serverTimeMs - this.clock.now();
    if (line.state === "PAUSED") {
      this.emit("update", this.farUpdate(placed, 0, null, true));
      this.farBack = true;
      return this.later(() => this.readLine(run), line.readCapS * 1000);
    }
    if (line.ratePerSec <= 0) return this.poll(run);
    const etaS = (placed.ahead - movedSince(line, this.clock.now() + offset)) / line.ratePerSec;
    this.follow(run, line, placed, offset, this.clock.now() + nextReadMs(etaS, line, this.random));
  }

  /** Between reads: the place moves at the line's rate, an update a second, until the next read or the window. */
  private follow(run: number, line: LineState, placed: Placement, offset: number, readAtMs: number): void {
    const moved = movedSince(line, this.clock.now() + offset);
    const etaS = Math.max(0, placed.ahead - moved) / line.ratePerSec;
    if (etaS <= line.presenceWindowS) return void this.poll(run);
    this.emit("update", this.farUpdate(placed, moved, line.ratePerSec, false));
    this.farBack = true;
    const untilRead = readAtMs - this.clock.now();
    const untilWindow = (etaS - line.presenceWindowS) * 1000;
    if (untilRead <= Math.min(1000, untilWindow)) return this.later(() => this.readLine(run), Math.max(0, untilRead));
    this.later(async () => this.follow(run, line, placed, offset, readAtMs), Math.min(1000, untilWindow));
  }

  private farUpdate(placed: Placement, moved: number, ratePerSec: number | null, paused: boolean): Update {
    const left = (count: number) => Math.max(0, count - moved);
    const eta = (count: number) => (ratePerSec ? Math.round(left(count) / ratePerSec) : null);
    return {
      state: "WAITING",
      position: Math.round(left(placed.ahead)) + 1,
      aheadCount: Math.round(left(placed.ahead)),
      etaSeconds: eta(placed.ahead),
      etaLowSeconds: eta(placed.aheadLow),
      etaHighSeconds: eta(placed.aheadHigh),
      paused,
      opensAt: null,
      pollAfterMs: null,
      fromLine: true,
    };
  }

  private admitted(entryToken: string, expiresAt: string | null, direct: boolean): void {
    const admission = { entryToken, expiresAt, direct };
    this.emit("admitted", admission);
    this.settle?.(admission);
  }

  /** A call that did not give an entry: ride out what passes (no answer, 429, 5xx), end on a refusal. */
  private failed(answer: Answer, again: () => Promise<void>): void {
    const error = failure(answer);
    if (answer.status === 0 || answer.status === 429 || answer.status >= 500) {
      this.failures += 1;
      const throttled = answer.status === 429 && !answer.code;
      const retryInMs = retryDelay(this.failures, answer.retryAfterMs, this.advisedMs, this.random, throttled);
      this.emit("trouble", { error, failures: this.failures, retryInMs });
      this.later(again, retryInMs);
      return;
    }
    this.end(error);
  }

  /** A refusal: polling stops, and join() rejects with it (or, once joined, an "error" event says it). */
  private end(error: QueueError): void {
    this.stop();
    if (this.settle) this.settle(null, error);
    else this.emit("error", error);
  }

  private later(next: () => Promise<void>, ms: number): void {
    const run = this.run;
    if (this.timer !== null) this.clock.clearTimeout(this.timer);
    this.timer = this.clock.setTimeout(() => {
      this.timer = null;
      if (run === this.run) void next();
    }, ms);
  }

  private expired(expiresAt: string | null | undefined): boolean {
    const at = expiresAt ? Date.parse(expiresAt) : NaN;
    return !Number.isNaN(at) && at <= this.clock.now();
  }

  private emit<E extends keyof Events>(event: E, value: Events[E]): void {
    for (const listener of this.listeners.get(event) ?? []) (listener as (value: Events[E]) => void)(value);
  }

  // --- one HTTP call, with the caller named and a JWT refreshed once on 401 ---

  private async call(method: string, url: string, headers: { [name: string]: string }, body?: string): Promise<Answer> {
    let answer = await this.send(method, url, { ...headers, ...(await this.identity(false)) }, body);
    if (answer.status === 401 && this.options.getToken) {
      // No new JWT (the page's, which sends the shopper to sign in instead): the 401 stands, nothing is resent.
      const fresh = await this.identity(true);
      if (fresh.Authorization) answer = await this.send(method, url, { ...headers, ...fresh }, body);
    }
    return answer;
  }

  private async identity(refresh: boolean): Promise<{ [name: string]: string }> {
    if (this.options.getToken) {
      const token = await this.options.getToken(refresh);
      return token ? { Authorization: `Bearer ${token}` } : {};
    }
    return this.options.userId !== undefined ? { "X-User-Id": this.options.userId } : {};
  }

  private async send(method: string, url: string, headers: { [name: string]: string }, body?: string): Promise<Answer> {
    const controller = new AbortController();
    const abort = this.clock.setTimeout(() => controller.abort(), this.options.callTimeoutMs ?? 8_000);
    try {
      const response = await this.fetch(url, { method, headers, body, cache: "no-store", signal: controller.signal });
      const text = await response.text();
      let parsed: unknown = null;
      try {
        parsed = text ? JSON.parse(text) : null;
      } catch {
        // not JSON: a gateway's or proxy's page
      }
      const json = parsed && typeof parsed === "object" ? (parsed as Json) : null;
      return {
        status: response.status,
        body: json,
        code: json && typeof json.code === "string" ? json.code : null,
        retryAfterMs: parseRetryAfter(response.headers.get("Retry-After"), this.clock.now()),
      };
    } catch {
      return { status: 0, body: null, code: null, retryAfterMs: null };
    } finally {
      this.clock.clearTimeout(abort);
    }
  }
}

function toUpdate(entry: Json): Update {
  const num = (value: unknown) => (typeof value === "number" && Number.isFinite(value) ? value : null);
  return {
    state: String(entry.status),
    position: num(entry.position),
    aheadCount: num(entry.aheadCount),
    etaSeconds: num(entry.etaSeconds),
    etaLowSeconds: num(entry.etaLowSeconds),
    etaHighSeconds: num(entry.etaHighSeconds),
    paused: entry.paused === true,
    opensAt: typeof entry.opensAt === "string" ? entry.opensAt : null,
    pollAfterMs: num(entry.pollAfterMs),
    fromLine: false,
  };
}

function failure(answer: Answer): QueueError {
  const detail = answer.body && typeof answer.body.detail === "string" ? answer.body.detail : "";
  if (answer.code) return new QueueError(answer.status, answer.code, detail, answer.retryAfterMs, answer.body);
  if (answer.status === 0) return new QueueError(0, "NETWORK", "no answer");
  const code = answer.status === 429 ? "THROTTLED" : "UNEXPECTED_ANSWER";
  return new QueueError(answer.status, code, detail || `HTTP ${answer.status}`, answer.retryAfterMs, answer.body);
}
