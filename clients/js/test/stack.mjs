// What the integration tests share: the local stack `make test-js` starts (tests/support/js_client.py), its
// operator API, and a fetch that records when each call went out and what it was advised.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const API = process.env.VQ_API_URL;
export const CONTROL = process.env.VQ_JS_CONTROL_URL;
/** Each test's `skip` option: the integration tests need the stack. */
export const NO_STACK = API ? false : "no local stack: run them through `make test-js`";

let nextTarget = 1000 + Math.floor(Math.random() * 1e6) * 100;
export const newTarget = () => String(nextTarget++);

export async function operator(method, path, body) {
  const response = await fetch(API + path, {
    method,
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  return { status: response.status, body: text ? JSON.parse(text) : null };
}

export async function configure(target, config) {
  const answer = await operator("PUT", `/virtual-queues/limited-drop/${target}/config`, config);
  if (answer.status !== 200) throw new Error(`PUT config: ${answer.status} ${JSON.stringify(answer.body)}`);
}

export async function patch(target, changes) {
  const answer = await operator("PATCH", `/virtual-queues/limited-drop/${target}/config`, changes);
  if (answer.status !== 200) throw new Error(`PATCH config: ${answer.status} ${JSON.stringify(answer.body)}`);
}

export const stats = async (target) => (await operator("GET", `/virtual-queues/limited-drop/${target}/stats`)).body;

export async function redis(action) {
  const response = await fetch(`${CONTROL}/redis/${action}`, { method: "POST" });
  if (response.status !== 204) throw new Error(`redis ${action}: ${response.status}`);
}

/** The real fetch, recording per call: when it went out, when it was answered, its status, and the wait the answer
 * advised (pollAfterMs, or Retry-After) before the next one. */
export function recordingFetch() {
  const calls = [];
  const recorded = async (url, init) => {
    const call = { method: init.method, url: String(url), sent: performance.now() };
    calls.push(call);
    try {
      const response = await fetch(url, init);
      const text = await response.text();
      call.answered = performance.now();
      call.status = response.status;
      let body = null;
      try {
        body = JSON.parse(text);
      } catch {}
      call.body = body;
      const retryAfter = response.headers.get("Retry-After");
      call.advisedMs = body && typeof body.pollAfterMs === "number" ? body.pollAfterMs : retryAfter ? Number(retryAfter) * 1000 : null;
      return new Response(text || null, { status: response.status, headers: response.headers });
    } catch (err) {
      call.answered = performance.now();
      call.status = 0;
      throw err;
    }
  };
  return { fetch: recorded, calls };
}

/** For each call after an advised one: how much sooner than advised it went out (<= 0 when never sooner). A /line
 * not published yet advises when to read /line again, and says to poll the place meanwhile (docs/api.md): a poll
 * right after it is as told. */
export function hurried(calls) {
  return calls.slice(1).flatMap((call, i) => {
    const before = calls[i];
    const pollNow = before.body?.code === "LINE_NOT_PUBLISHED" && !call.url.endsWith("/line");
    return before.advisedMs === null || before.advisedMs === undefined || pollNow
      ? []
      : [before.advisedMs - (call.sent - before.answered)];
  });
}

/** A storage kept in a file, as an app's survives its process: a restart reads what the last run wrote. */
export function fileStorage() {
  const folder = mkdtempSync(join(tmpdir(), "vq-client-"));
  const file = join(folder, "storage.json");
  const read = () => {
    try {
      return JSON.parse(readFileSync(file, "utf8"));
    } catch {
      return {};
    }
  };
  const write = (items) => writeFileSync(file, JSON.stringify(items));
  return {
    storage: () => ({
      getItem: async (key) => read()[key] ?? null,
      setItem: async (key, value) => write({ ...read(), [key]: value }),
      removeItem: async (key) => {
        const items = read();
        delete items[key];
        write(items);
      },
    }),
    remove: () => rmSync(folder, { recursive: true, force: true }),
  };
}

/** The first `event` the line emits, or a failure after `ms`. */
export function next(line, event, ms = 15_000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no ${event} within ${ms} ms`)), ms);
    const off = line.on(event, (value) => {
      clearTimeout(timer);
      off();
      resolve(value);
    });
  });
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
