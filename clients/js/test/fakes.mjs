// A fake clock and a scripted server for the unit tests: time moves only when a test says, and every call the
// line makes is recorded with the fake time it went out at.

export class FakeClock {
  constructor(start = Date.parse("2026-12-06T07:00:00Z")) {
    this.time = start;
    this.timers = new Map();
    this.next = 1;
  }
  now() {
    return this.time;
  }
  setTimeout(callback, ms) {
    const id = this.next++;
    this.timers.set(id, { at: this.time + Math.max(0, ms), callback });
    return id;
  }
  clearTimeout(id) {
    this.timers.delete(id);
  }
  /** Move time forward by `ms`, firing every timer due on the way in order, each chain of promises settled. */
  async advance(ms) {
    const end = this.time + ms;
    await settle();
    for (;;) {
      const due = [...this.timers.entries()].filter(([, t]) => t.at <= end).sort((a, b) => a[1].at - b[1].at)[0];
      if (!due) break;
      this.timers.delete(due[0]);
      this.time = due[1].at;
      due[1].callback();
      await settle();
    }
    this.time = end;
  }
}

export async function settle() {
  for (let i = 0; i < 5; i++) await new Promise((resolve) => setImmediate(resolve));
}

/** A fetch answering from `respond(call)` -> {status, body, headers} or a thrown error; `calls` records each. */
export function scriptedFetch(clock, respond) {
  const calls = [];
  const fetch = async (url, init) => {
    const call = { url: String(url), method: init.method, headers: init.headers, body: init.body, at: clock.now() };
    calls.push(call);
    // As a real fetch does, an abort rejects the call (the line aborts one unanswered after callTimeoutMs).
    const aborted = new Promise((_, reject) => init.signal?.addEventListener("abort", () => reject(new DOMException("aborted", "AbortError"))));
    const answer = await Promise.race([respond(call, calls.length), aborted]);
    const text = answer.body === undefined ? "" : typeof answer.body === "string" ? answer.body : JSON.stringify(answer.body);
    return new Response(answer.status === 204 ? null : text, { status: answer.status, headers: answer.headers ?? {} });
  };
  return { fetch, calls };
}

export const waiting = (position, pollAfterMs, extra = {}) => ({
  status: 200,
  body: { status: "WAITING", queueTicket: "ticket-1", position, aheadCount: position - 1, etaSeconds: position, etaLowSeconds: position, etaHighSeconds: position * 2, pollAfterMs, ...extra },
});

export const admitted = (token = "tok-1") => ({
  status: 200,
  body: { status: "ADMITTED", entryToken: token, tokenExpiresAt: "2026-12-06T07:30:00Z", queued: true },
});

export const refused = (status, code, headers = {}) => ({ status, body: { code, detail: code.toLowerCase() }, headers });
