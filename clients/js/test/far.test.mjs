// Far back (docs/api.md, "Far back: read the line, not your place"): the line's public state read from /line,
// the place worked out from the entry's seq, moved locally between reads, and the own place polled again only
// near the front. Against a scripted server and a fake clock.
import assert from "node:assert/strict";
import { test } from "node:test";

import { WaitingLine, nextReadMs, placeIn } from "../dist/index.js";
import { FakeClock, admitted, scriptedFetch } from "./fakes.mjs";

// The contract's worked example: a line of 1,000,000 at 50 a second.
const LINE = {
  serverTimeMs: 1796544001200,
  asOfMs: 1796544001000,
  state: "OPEN",
  mark: "1796540000000500",
  ratePerSec: 50.0,
  waitingCount: 1000000,
  presenceWindowS: 120,
  readCapS: 300,
  shape: [
    ["1796540000000501", 0],
    ["1796540000010503", 10000],
    ["1796540000020498", 20000],
    ["1796540001000497", 999999],
  ],
};
const SEQ = "1796540000015002";

test("the contract's worked example: 14,501.3 ahead, position 14,502, 290 s, the next read after 85 s less jitter", () => {
  const placed = placeIn(LINE, SEQ);
  assert.equal(placed.turnCame, false);
  assert.ok(Math.abs(placed.ahead - (10000 + (10000 * 4499) / 9995)) < 1e-9);
  assert.equal(Math.round(placed.ahead) + 1, 14502);
  assert.deepEqual([placed.aheadLow, placed.aheadHigh], [10000, 20000]);
  assert.equal(Math.round(placed.ahead / LINE.ratePerSec), 290);
  assert.equal(nextReadMs(290, LINE, () => 0), 85000);
  assert.equal(nextReadMs(290, LINE, () => 1), 76500);
  assert.equal(nextReadMs(10_000, LINE, () => 0), 300_000, "at most readCapS");
  assert.equal(nextReadMs(120.5, LINE, () => 0), 1000, "at least a second");
});

test("placing a seq: at or under the mark its turn came; before the first point nobody is ahead; past the last, all", () => {
  assert.equal(placeIn(LINE, "1796540000000500").turnCame, true);
  assert.equal(placeIn(LINE, "1796540000000499").turnCame, true);
  assert.equal(placeIn({ ...LINE, mark: "1" }, "1796540000000400").ahead, 0);
  assert.equal(placeIn(LINE, "1796540000010503").ahead, 10000);
  assert.equal(placeIn(LINE, "1796540009999999").ahead, 1000000);
  assert.equal(placeIn({ ...LINE, shape: [] }, SEQ).ahead, 0);
  // Seqs past 2^53 still compare exactly (BigInt): one apart is one apart.
  assert.equal(placeIn({ ...LINE, mark: "9007199254740993" }, "9007199254740994").turnCame, false);
  assert.equal(placeIn({ ...LINE, mark: "9007199254740993" }, "9007199254740993").turnCame, true);
});

const farWaiting = { status: 200, body: { status: "WAITING", queueTicket: "t-far", seq: SEQ, position: 14000, aheadCount: 13999, pollAfterMs: 150000, lineAfterMs: 150000 } };
const nearWaiting = { status: 200, body: { status: "WAITING", position: 40, aheadCount: 39, etaSeconds: 60, pollAfterMs: 1000 } };

function farLine(clock, lineAnswers, placeAnswers = [nearWaiting]) {
  let line = 0;
  let place = 0;
  const server = scriptedFetch(clock, (call) => {
    if (call.url.endsWith("/line")) {
      const answer = lineAnswers[Math.min(line++, lineAnswers.length - 1)];
      return typeof answer === "function" ? answer(clock) : answer;
    }
    if (call.method === "POST") return farWaiting;
    return placeAnswers[Math.min(place++, placeAnswers.length - 1)];
  });
  const queue = new WaitingLine({ baseUrl: "https://shop.example/api", type: "limited-drop", targetId: 7, userId: "42", fetch: server.fetch, clock, random: () => 0 });
  return { queue, calls: server.calls };
}

// The line as the origin would answer it now: the server's clock a second ahead of ours, written 200 ms before.
const lineNow = (changes = {}) => (clock) => ({ status: 200, body: { ...LINE, serverTimeMs: clock.now() + 1000, asOfMs: clock.now() + 800, ...changes } });

test("far back: reads /line after lineAfterMs with no identity, moves locally each second, reads again 85 s later", async () => {
  const clock = new FakeClock();
  const { queue, calls } = farLine(clock, [lineNow()]);
  const updates = [];
  queue.on("update", (u) => updates.push(u));
  await queue.join();
  await clock.advance(149_999);
  assert.deepEqual(calls.map((c) => c.method), ["POST"], "nothing before lineAfterMs");
  await clock.advance(1);
  const read = calls[1];
  assert.equal(read.url, "https://shop.example/api/virtual-queues/limited-drop/7/line");
  assert.equal(read.headers["X-User-Id"], undefined);
  assert.equal(read.headers.Authorization, undefined);
  const first = updates.find((u) => u.fromLine);
  assert.equal(first.position, Math.round(14501.25 - 50 * 0.2) + 1); // 200 ms of admissions since asOfMs
  assert.deepEqual([first.etaLowSeconds, first.etaHighSeconds], [Math.round((10000 - 10) / 50), Math.round((20000 - 10) / 50)]);
  await clock.advance(10_000);
  const later = updates.filter((u) => u.fromLine).at(-1);
  assert.equal(first.position - later.position, 500, "ten seconds at 50 a second");
  assert.equal(calls.length, 2, "no call between reads");
  // The second read: half the time to the window after the first (no jitter drawn), the wait counted from the
  // read: 289.8 s left then (200 ms of the line's 290 s had passed since asOfMs), so 84.9 s.
  await clock.advance(75_000);
  assert.equal(calls.length, 3);
  assert.ok(Math.abs(calls[2].at - calls[1].at - ((14501.25 - 10) / 50 - 120) * 500) < 1, `${calls[2].at - calls[1].at}`);
  assert.ok(calls.every((c) => !c.url.endsWith("/entries/me")), "its own place is never polled far back");
  queue.stop();
});

test("near the window the line polls its own place and follows pollAfterMs from then on", async () => {
  const clock = new FakeClock();
  // The mark has moved up to 100 s of the window away: eta 110 s <= 120 s.
  const close = lineNow({ shape: [["1796540000014000", 0], ["1796540000016000", 11000]], mark: "1796540000013999", ratePerSec: 100 });
  const { queue, calls } = farLine(clock, [close], [nearWaiting, nearWaiting, admitted("tok-far")]);
  const tokens = [];
  queue.on("admitted", (a) => tokens.push(a.entryToken));
  await queue.join();
  await clock.advance(150_000);
  assert.deepEqual(calls.map((c) => c.url.split("/").at(-1)), ["entries", "line", "me"]);
  await clock.advance(2_000);
  assert.deepEqual(calls.slice(3).map((c) => c.at - calls[2].at), [1000, 2000]);
  assert.deepEqual(tokens, ["tok-far"]);
});

test("a line that answers anything but a readable 200, is sold out, or has reached the seq sends the line to its place", async () => {
  const cases = [
    { status: 503, body: { code: "LINE_NOT_PUBLISHED", detail: "" }, headers: { "Retry-After": "1" } },
    { status: 404, body: { code: "UNKNOWN_TARGET", detail: "" } },
    { status: 200, body: { hello: "world" } },
    lineNow({ state: "SOLD_OUT" }),
    lineNow({ state: "OPENING" }),
    lineNow({ mark: SEQ }),
    lineNow({ ratePerSec: 0 }),
  ];
  for (const answer of cases) {
    const clock = new FakeClock();
    const { queue, calls } = farLine(clock, [answer]);
    await queue.join();
    await clock.advance(150_000);
    assert.deepEqual(calls.map((c) => c.url.split("/").at(-1)), ["entries", "line", "me"], JSON.stringify(answer));
    assert.equal(calls[2].at, calls[1].at, "at once");
    queue.stop();
  }
});

test("the edge's throttle on /line is waited out on /line (its back-off, never under lineAfterMs), not moved onto the origin", async () => {
  const clock = new FakeClock();
  const throttle = { status: 429, body: { message: "Too Many Requests" } };
  const { queue, calls } = farLine(clock, [throttle, throttle, lineNow()]);
  const troubles = [];
  queue.on("trouble", (t) => troubles.push([t.error.code, t.retryInMs]));
  await queue.join();
  await clock.advance(150_000 + 150_000 + 150_000);
  assert.deepEqual(calls.slice(0, 4).map((c) => c.url.split("/").at(-1)), ["entries", "line", "line", "line"]);
  assert.deepEqual(troubles, [["THROTTLED", 150_000], ["THROTTLED", 150_000]], "never sooner than lineAfterMs");
  queue.stop();
});

test("a paused line shows the place without a time and is read again after readCapS", async () => {
  const clock = new FakeClock();
  const { queue, calls } = farLine(clock, [lineNow({ state: "PAUSED", ratePerSec: 0 })]);
  const updates = [];
  queue.on("update", (u) => updates.push(u));
  await queue.join();
  await clock.advance(150_000);
  const paused = updates.at(-1);
  assert.deepEqual([paused.paused, paused.position, paused.etaSeconds, paused.fromLine], [true, 14502, null, true]);
  await clock.advance(300_000);
  assert.deepEqual(calls.map((c) => c.url.split("/").at(-1)), ["entries", "line", "line"]);
  assert.equal(calls[2].at - calls[1].at, 300_000);
  queue.stop();
});

test("wake() far back reads the line at once; near the front it asks nothing sooner", async () => {
  const clock = new FakeClock();
  const { queue, calls } = farLine(clock, [lineNow()]);
  await queue.join();
  await clock.advance(10_000);
  queue.wake();
  await clock.advance(0);
  assert.deepEqual(calls.map((c) => c.url.split("/").at(-1)), ["entries", "line"]);
  assert.equal(calls[1].at - calls[0].at, 10_000);
  queue.stop();
});
