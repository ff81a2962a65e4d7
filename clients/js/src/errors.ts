// Every code the queue answers with (docs/api.md, "Errors"), and the client's own for answers without one.

/** The codes of docs/api.md's error table (test/line.test.mjs keeps them equal), with the /line contract's. */
export const QUEUE_ERROR_CODES = [
  "INVALID_ARGUMENT",
  "UNAUTHENTICATED",
  "INVALID_QUEUE_TICKET",
  "NOT_INVITED",
  "QUEUE_BYPASS_DENIED",
  "ENTRY_TOKEN_USED",
  "UNKNOWN_TARGET_TYPE",
  "UNKNOWN_TARGET",
  "NOT_IN_QUEUE",
  "METHOD_NOT_ALLOWED",
  "QUEUE_CLOSED",
  "SOLD_OUT",
  "ALREADY_ADMITTED",
  "CONFIG_CHANGED",
  "SHARDS_IN_USE",
  "PAYLOAD_TOO_LARGE",
  "UNSUPPORTED_MEDIA_TYPE",
  "QUEUE_FULL",
  "ORIGIN_UNAVAILABLE",
  "QUEUE_UNAVAILABLE",
  "ORIGIN_NOT_CONFIGURED",
  "LINE_NOT_PUBLISHED",
] as const;

export type QueueErrorCode = (typeof QUEUE_ERROR_CODES)[number];

/**
 * What the client says when the answer has no code of the queue's:
 * NETWORK: no answer (refused, reset, or none within `callTimeoutMs`);
 * THROTTLED: a 429 without a code (the edge: API Gateway's throttle or the WAF);
 * UNEXPECTED_ANSWER: any other answer without a code (a gateway's or proxy's page, or a shop's refusal of its own);
 * NOT_ADMITTED: `buy` before the line handed over an entry token;
 * IN_LINE_ELSEWHERE: header mode, the user is in line from another window or device, which holds the ticket.
 */
export type ClientErrorCode = "NETWORK" | "THROTTLED" | "UNEXPECTED_ANSWER" | "NOT_ADMITTED" | "IN_LINE_ELSEWHERE";

export type ErrorCode = QueueErrorCode | ClientErrorCode;

/** A refusal or failure: `status` 0 when nothing answered; `retryAfterMs` from Retry-After, when sent. */
export class QueueError extends Error {
  readonly status: number;
  readonly code: ErrorCode | string;
  readonly detail: string;
  readonly retryAfterMs: number | null;
  /** The answer's body (a shop's refusal of a purchase carries its own fields). */
  readonly body: unknown;

  constructor(status: number, code: ErrorCode | string, detail: string, retryAfterMs: number | null = null, body: unknown = null) {
    super(`${code}${status ? ` (${status})` : ""}: ${detail}`);
    this.name = "QueueError";
    this.status = status;
    this.code = code;
    this.detail = detail;
    this.retryAfterMs = retryAfterMs;
    this.body = body;
  }
}

/** True when `err` is a QueueError, of `code` if given: `if (isQueueError(err, "SOLD_OUT")) ...`. */
export function isQueueError(err: unknown, code?: ErrorCode): err is QueueError {
  return err instanceof QueueError && (code === undefined || err.code === code);
}
