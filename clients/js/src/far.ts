// Far back: the line's public state (`GET .../line`, cached at the edge) instead of one's own place, and the place
// worked out from it locally (docs/api.md, "Far back: read the line, not your place").

/** The answer of `/line`. Seqs are strings of 16 digits: compared as BigInt. */
export interface LineState {
  serverTimeMs: number;
  asOfMs: number;
  state: "OPEN" | "PAUSED" | "SOLD_OUT" | "CLOSED" | "PRE_QUEUE" | "OPENING" | string;
  mark: string;
  ratePerSec: number;
  waitingCount: number;
  presenceWindowS: number;
  readCapS: number;
  shape: [string, number][];
}

/** Where a seq stands in the line as read: `ahead` interpolated between the points around it, which bound it. */
export interface Placement {
  turnCame: boolean;
  ahead: number;
  aheadLow: number;
  aheadHigh: number;
}

/** The line's answer, if it has the contract's shape; null otherwise (then the client polls its place). */
export function readLineState(body: unknown): LineState | null {
  if (!body || typeof body !== "object") return null;
  const b = body as { [field: string]: unknown };
  const numbers = ["serverTimeMs", "asOfMs", "ratePerSec", "waitingCount", "presenceWindowS", "readCapS"];
  if (!numbers.every((name) => typeof b[name] === "number" && Number.isFinite(b[name]))) return null;
  if (typeof b.state !== "string" || !isSeq(b.mark) || !Array.isArray(b.shape)) return null;
  if (!b.shape.every((p) => Array.isArray(p) && isSeq(p[0]) && typeof p[1] === "number")) return null;
  return b as unknown as LineState;
}

const isSeq = (value: unknown): value is string => typeof value === "string" && /^\d{1,20}$/.test(value);

/** Step 2 of the algorithm: the turn has come (seq <= mark), or how many are ahead, and between which bounds. */
export function placeIn(line: LineState, seq: string): Placement {
  const mine = BigInt(seq);
  if (mine <= BigInt(line.mark)) return { turnCame: true, ahead: 0, aheadLow: 0, aheadHigh: 0 };
  const shape = line.shape;
  if (shape.length === 0 || mine < BigInt(shape[0][0])) return { turnCame: false, ahead: 0, aheadLow: 0, aheadHigh: 0 };
  for (let i = 1; i < shape.length; i++) {
    const [s2, a2] = shape[i];
    if (mine > BigInt(s2)) continue;
    const [s1, a1] = shape[i - 1];
    const span = Number(BigInt(s2) - BigInt(s1));
    const ahead = span === 0 ? a1 : a1 + ((a2 - a1) * Number(mine - BigInt(s1))) / span;
    return { turnCame: false, ahead, aheadLow: a1, aheadHigh: a2 };
  }
  if (mine === BigInt(shape[shape.length - 1][0])) {
    const last = shape[shape.length - 1][1];
    return { turnCame: false, ahead: last, aheadLow: last, aheadHigh: last };
  }
  return { turnCame: false, ahead: line.waitingCount, aheadLow: line.waitingCount, aheadHigh: line.waitingCount };
}

/** How many were admitted since the line was written, at server time `serverNowMs` (step 5's local move). */
export function movedSince(line: LineState, serverNowMs: number): number {
  return Math.max(0, (line.ratePerSec * (serverNowMs - line.asOfMs)) / 1000);
}

/** Step 5: the next read of `/line`, in ms: half the time until the window, at most the cap, at least 1 s, shortened
 * by up to a tenth at random. */
export function nextReadMs(etaS: number, line: LineState, random: () => number): number {
  const seconds = Math.max(1, Math.min(line.readCapS, (etaS - line.presenceWindowS) / 2));
  return seconds * 1000 * (1 - random() / 10);
}
