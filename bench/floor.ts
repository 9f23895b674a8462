import http from "node:http";
import type { AddressInfo } from "node:net";
import pg from "pg";
import { Pool } from "undici";
import { announceReady, requiredEnv, serveControl } from "./child.js";

/**
 * A reference point for `npm run bench:floor`, not a gateway: the least a Node metering gateway
 * does per JSON chat request, with none of the product's checks. It reads and parses the
 * request, sends it to `UPSTREAM_URL` with undici (as the gateway does), parses the answer's
 * usage, prices it with bigint, and answers with the upstream's body and the charge as a header.
 *
 * With `FLOOR_DATABASE_URL`, it also writes what DESIGN.md requires of every request, in its
 * cheapest form: one committed INSERT of the request before the upstream call (the durable
 * record that must exist before any upstream call), and one UPDATE with the charge after the
 * answer (not awaited by the client, as the gateway's). No conditions, no locks on shared rows,
 * no batching: a lower bound of what the database costs per request, not a ledger.
 *
 * With `FLOOR_GROUP_COMMIT=true` as well, the writes that queue while one is in flight share
 * the next statement and commit (a multi-row INSERT, an UPDATE over a list), as the gateway's
 * ledger batches do: what the same durability costs at its cheapest under load.
 *
 * Streams are not served (400): the floor is measured for JSON only.
 */

const upstream = new URL(requiredEnv("UPSTREAM_URL"));
const databaseUrl = process.env.FLOOR_DATABASE_URL || undefined;
const host = process.env.HOST ?? "127.0.0.1";
const port = Number(process.env.PORT ?? "0");

const pool = new Pool(upstream.origin, { connections: 256 });
const db = databaseUrl ? new pg.Pool({ connectionString: databaseUrl, max: 16 }) : undefined;
const groupCommit = process.env.FLOOR_GROUP_COMMIT === "true";
if (db) {
  await db.query(
    "CREATE TABLE IF NOT EXISTS floor_requests (id bigint PRIMARY KEY, maximum numeric NOT NULL, charged numeric)",
  );
}

const inputPrice = 3n;
const outputPrice = 5n;
let nextId = BigInt(Date.now()) * 1_000n;
const pending = new Set<Promise<unknown>>();

/**
 * Group commit: rows queued while a statement is in flight go together in the next one.
 * `sql` takes two parallel arrays ($1 ids, $2 amounts).
 */
function groupWriter(
  database: pg.Pool,
  sql: string,
): (id: string, amount: string) => Promise<void> {
  let queue: { id: string; amount: string; done: (error?: unknown) => void }[] = [];
  let inFlight = false;
  const flush = (): void => {
    if (inFlight || queue.length === 0) return;
    const batch = queue;
    queue = [];
    inFlight = true;
    database
      .query(sql, [batch.map((b) => b.id), batch.map((b) => b.amount)])
      .then(
        () => batch.forEach((b) => b.done()),
        (error: unknown) => batch.forEach((b) => b.done(error)),
      )
      .finally(() => {
        inFlight = false;
        flush();
      });
  };
  return (id, amount) =>
    new Promise<void>((resolve, reject) => {
      queue.push({
        id,
        amount,
        done: (error) => (error === undefined ? resolve() : reject(error)),
      });
      flush();
    });
}

const insertRequest = db
  ? groupCommit
    ? groupWriter(
        db,
        "INSERT INTO floor_requests (id, maximum) SELECT * FROM unnest($1::bigint[], $2::numeric[])",
      )
    : async (id: string, amount: string) => {
        await db.query("INSERT INTO floor_requests (id, maximum) VALUES ($1, $2)", [id, amount]);
      }
  : undefined;
const recordCharge = db
  ? groupCommit
    ? groupWriter(
        db,
        "UPDATE floor_requests f SET charged = u.charged FROM unnest($1::bigint[], $2::numeric[]) AS u(id, charged) WHERE f.id = u.id",
      )
    : async (id: string, amount: string) => {
        await db.query("UPDATE floor_requests SET charged = $2 WHERE id = $1", [id, amount]);
      }
  : undefined;

interface Usage {
  prompt_tokens?: unknown;
  completion_tokens?: unknown;
}

function tokens(value: unknown): bigint {
  return typeof value === "number" && Number.isSafeInteger(value) && value >= 0
    ? BigInt(value)
    : 0n;
}

async function serve(raw: Buffer, res: http.ServerResponse): Promise<void> {
  const body = JSON.parse(raw.toString("utf8")) as Record<string, unknown>;
  if (body.stream === true) {
    res.writeHead(400, { "content-type": "application/json" });
    res.end('{"error":{"code":"invalid_request","message":"the floor serves JSON only"}}');
    return;
  }
  const maxTokens = tokens(body.max_tokens);
  const id = nextId++;
  await insertRequest?.(id.toString(), (maxTokens * outputPrice).toString());
  const answer = await pool.request({
    path: "/v1/chat/completions",
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const text = await answer.body.text();
  const usage = ((JSON.parse(text) as { usage?: Usage }).usage ?? {}) as Usage;
  const charge =
    tokens(usage.prompt_tokens) * inputPrice + tokens(usage.completion_tokens) * outputPrice;
  res.writeHead(answer.statusCode, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(text),
    "x-gateway-request-id": id.toString(),
    "x-gateway-credits-charged": charge.toString(),
  });
  res.end(text);
  if (recordCharge) {
    const update = recordCharge(id.toString(), charge.toString()).catch((error: unknown) =>
      process.stderr.write(`update failed: ${String(error)}\n`),
    );
    pending.add(update);
    void update.finally(() => pending.delete(update));
  }
}

const server = http.createServer({ keepAliveTimeout: 60_000 }, (req, res) => {
  const parts: Buffer[] = [];
  req.on("data", (part: Buffer) => parts.push(part));
  req.on("end", () => {
    serve(Buffer.concat(parts), res).catch((error: unknown) => {
      if (!res.headersSent) res.writeHead(500, { "content-type": "application/json" });
      res.end(JSON.stringify({ error: { code: "internal_error", message: String(error) } }));
    });
  });
});
server.on("connection", (socket) => socket.setNoDelay(true));

server.listen(port, host, () => {
  const { port: actual } = server.address() as AddressInfo;
  announceReady(db ? "floor-db" : "floor", `http://${host}:${actual}`);
});

serveControl(async () => {
  server.closeAllConnections();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  await Promise.allSettled(pending);
  await pool.close();
  await db?.end();
});
