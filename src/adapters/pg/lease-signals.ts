/**
 * Lease recall over PostgreSQL LISTEN/NOTIFY (docs/decisions/chat-quotes-and-money.md, "Reservation leases"): one
 * dedicated connection per process listens on `gw_lease_recall` (another process needs what
 * this one's leases hold idle) and `gw_lease_returned` (a holder answered a recall). Notifies
 * go out on the pool. The listening connection reconnects after a loss; while it is down a
 * recall waits its bound and the database is asked again (what the old behaviour did).
 *
 * LISTEN belongs to a session: through a pooler in transaction mode (PgBouncer) the server
 * connection goes back to the pool after the statement, and the notifications with it. The
 * listening connection therefore uses the direct connection's settings (`Database.session`);
 * NOTIFY is an ordinary statement and goes through the pool.
 */
import pg from "pg";
import type { Database } from "./database.js";
import type { LeaseSignals } from "../../domain/leases/store.js";

export interface PgLeaseSignalsOptions {
  /** This process: its own recalls are not answered by itself. */
  readonly instanceId: string;
  /** How long a recall waits for an answer before the database is asked again. */
  readonly waitMs?: number;
  readonly logger?: { warn(obj: object, msg: string): void } | undefined;
}

export interface PgLeaseSignals extends LeaseSignals {
  /** Resolves once the listening connection is up (or failed its first try). */
  ready(): Promise<void>;
  close(): Promise<void>;
}

const recallChannel = "gw_lease_recall";
const returnedChannel = "gw_lease_returned";

export function createPgLeaseSignals(
  db: Pick<Database, "pool" | "session">,
  options: PgLeaseSignalsOptions,
): PgLeaseSignals {
  const { pool, session } = db;
  const waitMs = options.waitMs ?? 1_000;
  const waiting = new Map<string, Set<() => void>>();
  const handlers: ((key: string) => void)[] = [];
  let client: pg.Client | undefined;
  let closed = false;
  let retry: NodeJS.Timeout | undefined;

  const deliver = (message: pg.Notification) => {
    if (message.payload === undefined) return;
    if (message.channel === returnedChannel) {
      const wakers = waiting.get(message.payload);
      if (wakers === undefined) return;
      waiting.delete(message.payload);
      for (const wake of wakers) wake();
      return;
    }
    let parsed: { key?: unknown; from?: unknown };
    try {
      parsed = JSON.parse(message.payload) as { key?: unknown; from?: unknown };
    } catch {
      return;
    }
    if (typeof parsed.key !== "string" || parsed.from === options.instanceId) return;
    for (const handler of handlers) handler(parsed.key);
  };

  const connect = async (): Promise<void> => {
    if (closed) return;
    // Its own connection, outside the pools: LISTEN holds it for the life of the process.
    const next = new pg.Client(session.options);
    next.on("error", () => undefined); // 'end' follows; reconnection is scheduled there
    next.on("notification", deliver);
    next.on("end", () => {
      if (client === next) client = undefined;
      if (!closed) retry ??= setTimeout(() => ((retry = undefined), void connect()), 1_000);
    });
    try {
      await next.connect();
      await next.query(`LISTEN ${recallChannel}; LISTEN ${returnedChannel}`);
      if (closed) {
        await next.end();
        return;
      }
      client = next;
    } catch (error) {
      options.logger?.warn(
        { err: error instanceof Error ? error.message : String(error) },
        "lease recall listener could not connect; retrying",
      );
      await next.end().catch(() => undefined);
    }
  };
  const started = connect();

  const notify = async (channel: string, payload: string) => {
    await pool.query("SELECT pg_notify($1, $2)", [channel, payload]);
  };

  return {
    async recall(key) {
      let wake!: () => void;
      const answered = new Promise<void>((resolve) => (wake = resolve));
      let wakers = waiting.get(key);
      if (wakers === undefined) waiting.set(key, (wakers = new Set()));
      wakers.add(wake);
      const timer = setTimeout(wake, waitMs);
      try {
        if (client !== undefined) {
          await notify(recallChannel, JSON.stringify({ key, from: options.instanceId }));
        }
        await answered;
      } catch {
        // The notify failed (database trouble): the database is asked again after the bound.
        await answered;
      } finally {
        clearTimeout(timer);
        wakers.delete(wake);
        if (wakers.size === 0 && waiting.get(key) === wakers) waiting.delete(key);
      }
    },
    async answer(key) {
      await notify(returnedChannel, key).catch(() => undefined);
    },
    onRecall(handler) {
      handlers.push(handler);
    },
    ready: () => started,
    async close() {
      closed = true;
      if (retry !== undefined) clearTimeout(retry);
      const current = client;
      client = undefined;
      await current?.end().catch(() => undefined);
      for (const wakers of waiting.values()) for (const wake of wakers) wake();
      waiting.clear();
    },
  };
}
