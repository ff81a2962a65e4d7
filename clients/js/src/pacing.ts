// When the client asks next: as the server advises, and never sooner (docs/architecture.md#polling).

/** Backing off without a Retry-After: 1 s, 2 s, 4 s... up to this, each drawn from its upper half. */
export const MAX_BACKOFF_MS = 15_000;
const FIRST_BACKOFF_MS = 1_000;
/** The edge's throttle (a 429 without a code or Retry-After): 5 s, doubled per refusal in a row up to 60 s, as the
 * waiting-room page waits (docs/api.md: never within a few seconds). */
export const THROTTLED_MS = 5_000;
export const MAX_THROTTLED_MS = 60_000;
/** A floor under any advice, against a server that says 0 by mistake (real advice is a second or more). */
export const MIN_POLL_MS = 250;

/** The next poll after a PRE_QUEUE or WAITING answer: its `pollAfterMs`, exactly. Without one (an older server),
 * every 2-3 s, or before an opening, just after it (at most 20 s ahead). */
export function pollDelay(pollAfterMs: unknown, opensAtMs: number | null, nowMs: number, random: () => number): number {
  const advised = typeof pollAfterMs === "number" && Number.isFinite(pollAfterMs) ? pollAfterMs : null;
  if (advised !== null && advised >= 0) return Math.max(advised, MIN_POLL_MS);
  if (opensAtMs !== null) return Math.min(Math.max(opensAtMs - nowMs, 0), 20_000) + 500 + random() * 2_000;
  return 2_000 + random() * 1_000;
}

/**
 * The wait before trying again after the `failures`-th failure in a row (429, 503, 5xx, no answer). With
 * Retry-After, that long and up to a tenth more, so that a crowd told the same moment does not come back as one
 * wave; without, exponential back-off drawn from the upper half of 1, 2, 4... 15 s; after the edge's throttle,
 * 5, 10, 20, 40, 60 s, less up to a tenth so the throttled spread out. Never sooner than the server last advised.
 */
export function retryDelay(failures: number, retryAfterMs: number | null, advisedMs: number | null, random: () => number, throttled = false): number {
  let wait: number;
  const nth = Math.min(Math.max(failures, 1) - 1, 4);
  if (throttled && retryAfterMs === null) {
    wait = Math.min(MAX_THROTTLED_MS, THROTTLED_MS * 2 ** nth) * (1 - random() / 10);
  } else if (retryAfterMs !== null) {
    wait = retryAfterMs * (1 + random() / 10);
  } else {
    const ceiling = Math.min(MAX_BACKOFF_MS, FIRST_BACKOFF_MS * 2 ** nth);
    wait = ceiling / 2 + (random() * ceiling) / 2;
  }
  return Math.max(wait, advisedMs ?? 0);
}

/** Retry-After in milliseconds: seconds, or an HTTP date (RFC 9110 §10.2.3); null when absent or unreadable. */
export function parseRetryAfter(value: string | null, nowMs: number): number | null {
  if (value === null || value.trim() === "") return null;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Number(text) * 1000;
  const at = Date.parse(text);
  return Number.isNaN(at) ? null : Math.max(at - nowMs, 0);
}
