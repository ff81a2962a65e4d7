// Pacing and back-off against a fake clock: the line asks exactly when the server says, and never sooner.
import assert from "node:assert/strict";
import { test } from "node:test";

import { MAX_BACKOFF_MS, WaitingLine, parseRetryAfter, retryDelay } from "../dist/index.js";
import { FakeClock, admitted, refused, scriptedFetch, waiting } from "./fakes.mjs";

function line(clock, respond, options = {}) {
  const server = scriptedFetch(clock, respond);
  const queue = new WaitingLine({ baseUrl: "https://shop.example/api", type: "limited-drop", targetId: 7, userId: "42", fetch: server.fetch, clock, ...options });
  return { queue, calls: server.calls };
}

const gaps = (calls) => calls.slice(1).map((call, i) => call.at - calls[i].at);

test("polls exactly when each answer's pollAfterMs says, whatever it says", async () => {
  const clock = new FakeClock();
  const advice = [9000, 4500, 1200, 1000, 1000];
  const { queue, calls } = line(clock, (_, n) => (n <= advice.length ? waiting(10 - n, advice[n - 1]) : admitted()));
  const tokens = [];
  queue.on("admitted", (a) => tokens.push(a.entryToken));
  const first = await queue.join();
  assert.equal(first.state, "WAITING");
  assert.equal(first.pollAfterMs, 9000);
  await clock.advance(60_000);
  assert.deepEqual(gaps(calls), advice);
  assert.deepEqual(calls.map((c) => c.method), ["POST", "GET", "GET", "GET", "GET", "GET"]);
  assert.deepEqual(tokens, ["tok-1"]);
  assert.equal(calls.length, 6, "no poll after the admission");
});

test("each update carries the place and the range the wait is expected in", async () => {
  const clock = new FakeClock();
  const { queue } = line(clock, () => waiting(5, 2000, { paused: true }));
  const updates = [];
  queue.on("update", (u) => updates.push(u));
  await queue.join();
  assert.deepEqual(updates[0], {
    state: "WAITING", position: 5, aheadCount: 4, etaSeconds: 5, etaLowSeconds: 5, etaHighSeconds: 10,
    paused: true, opensAt: null, pollAfterMs: 2000, fromLine: false,
  });
  queue.stop();
});

test("a 429 storm with Retry-After: every try waits it out, plus at most a tenth, never sooner", async () => {
  const clock = new FakeClock();
  let random = 0;
  const { queue, calls } = line(clock, (_, n) => (n <= 6 ? refused(429, "QUEUE_FULL", { "Retry-After": "3" }) : waiting(1, 1000)), {
    random: () => (random = (random + 0.37) % 1),
  });
  const troubles = [];
  queue.on("trouble", (t) => troubles.push(t));
  const joined = queue.join();
  await clock.advance(30_000);
  await joined;
  queue.stop();
  for (const gap of gaps(calls.slice(0, 7))) assert.ok(gap >= 3000 && gap <= 3300, `gap ${gap}`);
  assert.deepEqual(troubles.map((t) => t.error.code), Array(6).fill("QUEUE_FULL"));
  assert.deepEqual(troubles.map((t) => t.failures), [1, 2, 3, 4, 5, 6]);
});

test("without Retry-After, 503 and 502 back off 1, 2, 4, 8, 15 s (upper half drawn), then stay at 15 s", async () => {
  for (const failing of [refused(503, "QUEUE_UNAVAILABLE"), { status: 502, body: "<html>bad gateway</html>" }]) {
    for (const draw of [0, 0.999]) {
      const clock = new FakeClock();
      const { queue, calls } = line(clock, (_, n) => (n <= 7 ? failing : waiting(1, 1000)), { random: () => draw });
      const joined = queue.join();
      await clock.advance(120_000);
      await joined;
      queue.stop();
      const ceilings = [1000, 2000, 4000, 8000, 15000, MAX_BACKOFF_MS, MAX_BACKOFF_MS];
      gaps(calls.slice(0, 8)).forEach((gap, i) => {
        assert.ok(gap >= ceilings[i] / 2 && gap <= ceilings[i], `${failing.status} gap ${i}: ${gap}`);
      });
    }
  }
});

test("the edge's 429 (no code, no Retry-After) waits 5, 10, 20, 40, 60 s, less up to a tenth, never under the advice", async () => {
  const throttle = { status: 429, body: { message: "Too Many Requests" } };
  for (const draw of [0, 0.999]) {
    const clock = new FakeClock();
    const { queue, calls } = line(clock, (_, n) => (n <= 7 ? throttle : waiting(1, 1000)), { random: () => draw });
    const joined = queue.join();
    await clock.advance(400_000);
    await joined;
    queue.stop();
    const expected = [5, 10, 20, 40, 60, 60, 60].map((s) => s * 1000 * (1 - draw / 10));
    gaps(calls.slice(0, 8)).forEach((gap, i) => assert.ok(Math.abs(gap - expected[i]) < 1, `gap ${i}: ${gap}`));
  }
  // Told to come back in 20 s, a throttled poll waits at least that, unshortened.
  const clock = new FakeClock();
  const { queue, calls } = line(clock, (_, n) => (n === 1 ? waiting(900, 20000) : n === 2 ? throttle : waiting(899, 20000)), { random: () => 0.999 });
  await queue.join();
  await clock.advance(41_000);
  queue.stop();
  assert.deepEqual(gaps(calls).slice(0, 2), [20000, 20000]);
});

test("trouble never brings a poll sooner than the server last advised", async () => {
  const clock = new FakeClock();
  const { queue, calls } = line(clock, (_, n) => (n === 1 ? waiting(900, 20000) : n <= 3 ? { status: 502, body: "<html>bad gateway</html>" } : waiting(899, 20000)), {
    random: () => 0,
  });
  await queue.join();
  await clock.advance(70_000);
  queue.stop();
  assert.deepEqual(gaps(calls).slice(0, 3), [20000, 20000, 20000]);
});

test("no answer at all (refused, or none within callTimeoutMs) is ridden out the same way", async () => {
  const clock = new FakeClock();
  const { queue, calls } = line(
    clock,
    (call, n) => {
      if (n === 1) throw new TypeError("fetch failed");
      if (n === 2) return new Promise(() => {}); // hangs: the line aborts it after callTimeoutMs
      return waiting(3, 1000);
    },
    { callTimeoutMs: 4000, random: () => 0 },
  );
  const troubles = [];
  queue.on("trouble", (t) => troubles.push([t.error.code, t.error.status, t.retryInMs]));
  const joined = queue.join();
  await clock.advance(30_000);
  assert.equal((await joined).position, 3);
  queue.stop();
  assert.deepEqual(troubles, [["NETWORK", 0, 500], ["NETWORK", 0, 1000]]);
});

test("retryDelay and parseRetryAfter, directly", () => {
  assert.equal(retryDelay(1, 2000, null, () => 0), 2000);
  assert.equal(retryDelay(1, 2000, null, () => 1), 2200);
  assert.equal(retryDelay(1, 2000, 5000, () => 0), 5000);
  assert.equal(retryDelay(9, null, null, () => 1), MAX_BACKOFF_MS);
  const now = Date.parse("2026-12-06T07:00:00Z");
  assert.equal(parseRetryAfter("7", now), 7000);
  assert.equal(parseRetryAfter("Sun, 06 Dec 2026 07:00:30 GMT", now), 30000);
  assert.equal(parseRetryAfter("soon", now), null);
  assert.equal(parseRetryAfter(null, now), null);
});
