// virtual-queue-client: the queue's protocol (docs/api.md) in one small library for web, React Native and Node.
export { WaitingLine } from "./line.js";
export type { Admission, Clock, EntryStatus, Purchase, Trouble, Update, WaitingLineOptions } from "./line.js";
export { QUEUE_ERROR_CODES, QueueError, isQueueError } from "./errors.js";
export type { ClientErrorCode, ErrorCode, QueueErrorCode } from "./errors.js";
export { memoryStorage } from "./storage.js";
export type { TicketStorage } from "./storage.js";
export { movedSince, nextReadMs, placeIn, readLineState } from "./far.js";
export type { LineState, Placement } from "./far.js";
export { MAX_BACKOFF_MS, MAX_THROTTLED_MS, THROTTLED_MS, MIN_POLL_MS, parseRetryAfter, pollDelay, retryDelay } from "./pacing.js";
