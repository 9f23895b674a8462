/**
 * Authority signals over PostgreSQL LISTEN/NOTIFY (docs/decisions/authority-and-signing.md, "Authority across
 * processes"): one dedicated connection per process listens on `gw_authority`, which the
 * triggers of migration 029 notify at the commit of every change to an API key or to a permit
 * authorization, whoever made it (functions/authority-signals.sql). Payloads: `key:<api key id>`
 * (drop what is held of that key) and `all` (drop everything held).
 *
 * The connection reconnects after a loss, waiting longer after each failed try (from 100 ms,
 * doubling, to 5 s); one that stops answering its heartbeat (`SELECT 1` every 10 s) counts as
 * lost. While it is down, notifications are lost: what is held then lives out its
 * cache time (API_KEY_CACHE_MS), and once the listener is back every holder is told `all`
 * (whatever changed meanwhile is read afresh). `onState` follows it for the
 * `gateway_authority_listener_up` gauge.
 *
 * LISTEN belongs to a session: like the lease-recall listener (lease-signals.ts) it uses the
 * direct connection's settings (`Database.session`), never a transaction pooler's.
 */
import pg from "pg";
import type { Database } from "./database.js";

/** What a signal asks of the holders of authority. */
export type AuthoritySignal = { readonly key: string } | "all";

export const authorityChannel = "gw_authority";

export interface PgAuthoritySignalsOptions {
  /** Called for every signal (and with `all` each time the listener comes back). */
  readonly onSignal: (signal: AuthoritySignal) => void;
  /** Called when the listener goes up (true) or down (false). */
  readonly onState?: (up: boolean) => void;
  readonly logger?: { warn(obj: object, msg: string): void };
  /** First wait before reconnecting, doubled after each failed try up to `maxRetryMs`. */
  readonly retryMs?: number;
  readonly maxRetryMs?: number;
  /**
   * Between two checks that the listening connection still answers (`SELECT 1`, given as long
   * to answer): a connection that went silent (a hung server, a dropped route) is given up and
   * replaced, so the gauge never says up while nothing can be heard. Default 10 s.
   */
  readonly heartbeatMs?: number;
}

export interface PgAuthoritySignals {
  /** Resolves once the listening connection is up (or failed its first try). */
  ready(): Promise<void>;
  /** Whether the listener is up now. */
  readonly up: boolean;
  close(): Promise<void>;
}

/** Reads a payload of `gw_authority`; undefined for one this code does not know. */
export function parseAuthoritySignal(payload: string | undefined): AuthoritySignal | undefined {
  if (payload === "all") return "all";
  if (payload?.startsWith("key:") === true && payload.length > 4) return { key: payload.slice(4) };
  return undefined;
}

export function createPgAuthoritySignals(
  db: Pick<Database, "session">,
  options: PgAuthoritySignalsOptions,
): PgAuthoritySignals {
  const firstRetryMs = options.retryMs ?? 100;
  const maxRetryMs = options.maxRetryMs ?? 5_000;
  const heartbeatMs = options.heartbeatMs ?? 10_000;
  let retryMs = firstRetryMs;
  let client: pg.Client | undefined;
  let closed = false;
  let retry: NodeJS.Timeout | undefined;
  let heartbeat: NodeJS.Timeout | undefined;

  const setUp = (up: boolean): void => {
    options.onState?.(up);
  };

  const schedule = (): void => {
    if (closed || retry !== undefined) return;
    const wait = retryMs;
    retryMs = Math.min(maxRetryMs, retryMs * 2);
    retry = setTimeout(() => {
      retry = undefined;
      void connect();
    }, wait);
    retry.unref();
  };

  const deliver = (message: pg.Notification): void => {
    if (message.channel !== authorityChannel) return;
    const signal = parseAuthoritySignal(message.payload);
    if (signal !== undefined) options.onSignal(signal);
  };

  /** The connection is gone (or silent): down, and another is tried. */
  const lost = (which: pg.Client, why: string): void => {
    if (client !== which) return;
    client = undefined;
    if (heartbeat !== undefined) clearInterval(heartbeat);
    heartbeat = undefined;
    setUp(false);
    options.logger?.warn(
      { reason: why },
      "authority listener lost its connection: API key and authorization changes made elsewhere apply within API_KEY_CACHE_MS until it is back",
    );
    which.end().catch(() => undefined);
    schedule();
  };

  const beat = (which: pg.Client): void => {
    let timer: NodeJS.Timeout | undefined;
    const silent = new Promise<never>((_, reject) => {
      timer = setTimeout(
        () => reject(new Error(`no answer within ${heartbeatMs} ms`)),
        heartbeatMs,
      );
    });
    Promise.race([which.query("SELECT 1"), silent])
      .catch((error: unknown) =>
        lost(which, error instanceof Error ? error.message : String(error)),
      )
      .finally(() => clearTimeout(timer));
  };

  const connect = async (): Promise<void> => {
    if (closed) return;
    // Its own connection, outside the pools: LISTEN holds it for the life of the process.
    const next = new pg.Client(db.session.options);
    next.on("error", () => undefined); // 'end' follows; reconnection is scheduled there
    next.on("notification", deliver);
    // Not up yet: the failed try schedules the next.
    next.on("end", () => lost(next, "connection ended"));
    try {
      await next.connect();
      await next.query(`LISTEN ${authorityChannel}`);
      if (closed) {
        await next.end();
        return;
      }
      client = next;
      retryMs = firstRetryMs;
      heartbeat = setInterval(() => beat(next), heartbeatMs);
      heartbeat.unref();
      setUp(true);
      // Whatever changed while no one listened is read afresh.
      options.onSignal("all");
    } catch (error) {
      options.logger?.warn(
        { err: error instanceof Error ? error.message : String(error) },
        "authority listener could not connect; retrying",
      );
      await next.end().catch(() => undefined);
      schedule();
    }
  };
  setUp(false);
  const started = connect();

  return {
    ready: () => started,
    get up() {
      return client !== undefined;
    },
    async close() {
      closed = true;
      if (retry !== undefined) clearTimeout(retry);
      if (heartbeat !== undefined) clearInterval(heartbeat);
      retry = undefined;
      heartbeat = undefined;
      const current = client;
      client = undefined;
      if (current !== undefined) setUp(false);
      await current?.end().catch(() => undefined);
    },
  };
}
