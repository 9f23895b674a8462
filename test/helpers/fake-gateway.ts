import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo } from "node:net";

/**
 * A gateway that is not what it claims (issue 28, item 1): a real HTTP server that forwards
 * every request to a real gateway and answers what it answers, except where a test tells it to
 * change an answer (a challenge rewritten, say) or to answer a redirect instead. It records every
 * request it received, bodies included, so a test can show that no signature reached it.
 */
export interface FakeGatewayRequest {
  readonly method: string;
  /** Path and query. */
  readonly path: string;
  readonly body: string;
}

type Match = (req: { method: string; path: string }) => boolean;
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Change = (body: any) => unknown;

export interface FakeGateway {
  readonly url: string;
  readonly port: number;
  /** Every request received, in order. */
  readonly received: FakeGatewayRequest[];
  /** The requests that carried a signature (a JSON body with a `signature` member). */
  signaturesReceived(): FakeGatewayRequest[];
  /** From now on, the JSON answers (2xx) of requests `match` selects go through `change`. */
  rewrite(match: Match, change: Change): void;
  /** From now on, requests `match` selects are answered `status` with `Location: location`. */
  redirect(match: Match, location: string, status?: number): void;
  /** Forgets the rules and the requests received. */
  reset(): void;
  close(): Promise<void>;
}

/** `POST /v1/permit-authorizations/challenge`-style matcher. */
export const route =
  (method: string, path: string | RegExp): Match =>
  (req) =>
    req.method === method &&
    (typeof path === "string" ? req.path.split("?")[0] === path : path.test(req.path));

async function bodyOf(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString("utf8");
}

/** Starts one on port 0 of `host` (default loopback), forwarding to `target` (a base URL). */
export async function startFakeGateway(target: string, host = "127.0.0.1"): Promise<FakeGateway> {
  const received: FakeGatewayRequest[] = [];
  let rewrites: { match: Match; change: Change }[] = [];
  let redirects: { match: Match; location: string; status: number }[] = [];
  const server: Server = createServer((req, res) => {
    void (async () => {
      const method = req.method ?? "GET";
      const path = req.url ?? "/";
      const body = await bodyOf(req);
      received.push({ method, path, body });
      const redirect = redirects.find((r) => r.match({ method, path }));
      if (redirect !== undefined) {
        res.writeHead(redirect.status, { location: redirect.location, "content-length": "0" });
        res.end();
        return;
      }
      const headers: Record<string, string> = {};
      for (const name of ["authorization", "content-type", "x-api-key"]) {
        const value = req.headers[name];
        if (typeof value === "string") headers[name] = value;
      }
      const answer = await fetch(new URL(path, target), {
        method,
        headers,
        redirect: "manual",
        ...(body === "" ? {} : { body }),
      });
      let text = await answer.text();
      const rewrite = rewrites.find((r) => r.match({ method, path }));
      if (rewrite !== undefined && answer.status >= 200 && answer.status < 300)
        text = JSON.stringify(rewrite.change(JSON.parse(text)));
      res.writeHead(answer.status, {
        "content-type": answer.headers.get("content-type") ?? "application/json",
        "content-length": Buffer.byteLength(text),
      });
      res.end(text);
    })().catch((error: unknown) => {
      res.writeHead(502, { "content-type": "text/plain" });
      res.end(String(error));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://${host === "0.0.0.0" ? "127.0.0.1" : host}:${port}`,
    port,
    received,
    signaturesReceived: () =>
      received.filter((r) => {
        try {
          return typeof (JSON.parse(r.body) as { signature?: unknown }).signature === "string";
        } catch {
          return false;
        }
      }),
    rewrite(match, change) {
      rewrites.push({ match, change });
    },
    redirect(match, location, status = 307) {
      redirects.push({ match, location, status });
    },
    reset() {
      rewrites = [];
      redirects = [];
      received.length = 0;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
