import type { Logger } from "pino";
import {
  BatchStatus,
  type FlushResponse,
  type SettlementBatch,
} from "../../gen/gateway/v1/settlement_pb.js";
import { describeRpcFailure, operatorAuth, type SettlementClient } from "../clients/settlement.js";

/** Retry delays after failed flushes: `initialMs`, doubling, at most `maxMs`. */
export interface BackoffOptions {
  readonly initialMs: number;
  readonly maxMs: number;
  /**
   * Share of each delay taken off at random (0 to 0.5), so workers on several
   * hosts that failed together do not retry in lockstep. Below 0.5 every delay
   * is still longer than the one before it.
   */
  readonly jitter: number;
}

export const defaultBackoff: BackoffOptions = { initialMs: 1000, maxMs: 60_000, jitter: 0.2 };

export interface SettlementWorkerOptions {
  readonly client: SettlementClient;
  /** The settlement operator token; sent as `authorization: Bearer …`, never logged. */
  readonly token: string;
  /** Pause between the end of one Flush and the start of the next. */
  readonly intervalMs: number;
  /** Settle at most this many requests per Flush (default: all pending). */
  readonly maxRequests?: number;
  readonly logger: Logger;
  readonly backoff?: Partial<BackoffOptions>;
  /** How long `stop()` lets a Flush in flight finish before aborting it (default 10 s). */
  readonly stopGraceMs?: number;
  /** Releases the transport once stopped (the connection's `close`); called once. */
  readonly close?: () => void;
}

export interface SettlementWorker {
  /** Flushes now, then every `intervalMs` after the previous call ended. */
  start(): void;
  /**
   * Stops the timer, lets a Flush in flight finish for up to `stopGraceMs`,
   * then aborts it and closes the connection. Aborting is safe: the gateway
   * persists each batch before it sends it and resumes it on the next Flush.
   */
  stop(): Promise<void>;
  /** One Flush now, logged like the periodic ones; rejects on failure (no retry). */
  flushOnce(options?: { dryRun?: boolean }): Promise<FlushResponse>;
}

/** `BATCH_STATUS_SETTLED` -> `settled`, the word the REST view uses. */
function statusWord(status: BatchStatus): string {
  return BatchStatus[status]?.toLowerCase() ?? String(status);
}

function batchFields(batch: SettlementBatch) {
  return {
    batch_id: batch.batchId,
    requests: Number(batch.requests),
    credits: batch.credits,
    charges: Number(batch.charges),
    tx_hash: batch.txHash || null,
    status: statusWord(batch.status),
    ...(batch.error === "" ? {} : { error: batch.error }),
  };
}

/** Logs what a Flush answered: each batch, each charge taken out, then the totals. */
function report(log: Logger, response: FlushResponse, dryRun: boolean): void {
  if (response.busy) {
    log.debug("another flusher holds the settlement account; this flush sent nothing");
    return;
  }
  for (const batch of response.batches) {
    const fields = batchFields(batch);
    if (batch.status === BatchStatus.FAILED) log.warn(fields, "settlement batch failed");
    else if (batch.error !== "") log.warn(fields, "settlement batch in flight, stalled");
    else log.info(fields, dryRun ? "settlement batch (dry run)" : "settlement batch");
  }
  for (const charge of response.unsettleable) {
    log.warn(
      {
        permit_id: charge.permitId,
        offer_id: charge.offerId,
        requests: Number(charge.requests),
        credits: charge.credits,
        reason: charge.reason,
      },
      "charges can never settle; taken out of settlement",
    );
  }
  if (response.batches.length === 0 && response.unsettleable.length === 0) {
    log.debug("nothing to settle");
  } else if (!dryRun) {
    log.info(
      {
        settled_requests: Number(response.settledRequests),
        settled_credits: response.settledCredits,
      },
      "settlement flush done",
    );
  }
}

/** Codes a retry cannot cure without an operator (wrong token, gateway without a settlement key). */
const needsOperator = new Set(["unauthenticated", "permission_denied", "unimplemented"]);

/**
 * The settlement worker: calls `SettlementService.Flush` over gRPC on a timer.
 * Settlement itself (batching, signing, exactly-once) lives in the gateway;
 * the worker only decides when to ask, so it can run as its own process on
 * any number of hosts: the gateway answers `busy` to all but one caller per
 * settlement account. Failures are retried with capped exponential backoff
 * with jitter, so an unreachable gateway is not hammered and recovers on its
 * own; the next call after a success waits `intervalMs` again.
 */
export function createSettlementWorker(options: SettlementWorkerOptions): SettlementWorker {
  const { client, intervalMs } = options;
  const backoff = { ...defaultBackoff, ...options.backoff };
  const stopGraceMs = options.stopGraceMs ?? 10_000;
  const log = options.logger.child({ component: "settlement-worker" });
  const auth = operatorAuth(options.token);

  let started = false;
  let stopped = false;
  let stopping: Promise<void> | undefined;
  let timer: NodeJS.Timeout | undefined;
  let failures = 0;
  const inFlight = new Set<{
    readonly controller: AbortController;
    readonly done: Promise<void>;
  }>();

  async function flushOnce(flush: { dryRun?: boolean } = {}): Promise<FlushResponse> {
    if (stopped) throw new Error("the settlement worker is stopped");
    const dryRun = flush.dryRun === true;
    const controller = new AbortController();
    const call = client.flush(
      {
        ...(options.maxRequests === undefined ? {} : { maxRequests: options.maxRequests }),
        dryRun,
      },
      { ...auth, signal: controller.signal },
    );
    const entry = { controller, done: call.then(noop, noop) };
    inFlight.add(entry);
    try {
      const response = await call;
      report(log, response, dryRun);
      return response;
    } finally {
      inFlight.delete(entry);
    }
  }

  function retryDelay(attempt: number): number {
    const base = Math.min(backoff.maxMs, backoff.initialMs * 2 ** (attempt - 1));
    const jitter = Math.min(Math.max(backoff.jitter, 0), 0.5);
    return Math.round(base * (1 - jitter * Math.random()));
  }

  async function tick(): Promise<void> {
    timer = undefined;
    let delay = intervalMs;
    try {
      await flushOnce();
      if (failures > 0) log.info({ failures }, "settlement flush recovered");
      failures = 0;
    } catch (error) {
      if (stopped) return; // stop() aborted it
      failures += 1;
      delay = retryDelay(failures);
      const failure = describeRpcFailure(error);
      const fields = {
        code: failure.code,
        reason: failure.reason,
        error: failure.message,
        attempt: failures,
        retry_in_ms: delay,
      };
      if (needsOperator.has(failure.code)) log.error(fields, "settlement flush refused");
      else log.warn(fields, "settlement flush failed");
    }
    if (!stopped) timer = setTimeout(() => void tick(), delay);
  }

  return {
    start() {
      if (stopped) throw new Error("the settlement worker is stopped");
      if (started) return;
      started = true;
      log.info(
        { interval_ms: intervalMs, max_requests: options.maxRequests },
        "settlement worker started",
      );
      timer = setTimeout(() => void tick(), 0);
    },

    stop() {
      stopping ??= (async () => {
        stopped = true;
        clearTimeout(timer);
        timer = undefined;
        const pending = [...inFlight];
        if (pending.length > 0) {
          let graceTimer: NodeJS.Timeout | undefined;
          const finished = await Promise.race([
            Promise.all(pending.map((p) => p.done)).then(() => true),
            new Promise<boolean>((resolve) => {
              graceTimer = setTimeout(() => resolve(false), stopGraceMs);
            }),
          ]);
          clearTimeout(graceTimer);
          if (!finished) {
            log.warn(
              { grace_ms: stopGraceMs },
              "aborting the flush in flight; the gateway resumes its batches on the next flush",
            );
            for (const p of pending) p.controller.abort();
            await Promise.all(pending.map((p) => p.done));
          }
        }
        options.close?.();
        if (started) log.info("settlement worker stopped");
      })();
      return stopping;
    },

    flushOnce,
  };
}

function noop(): void {}
