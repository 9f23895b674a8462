import http from "node:http";
import type { AddressInfo } from "node:net";
import { announceReady, requiredEnv, serveControl } from "./child.js";

/**
 * The floor any Node gateway pays: a minimal reverse proxy on `node:http` that pipes each
 * request to `UPSTREAM_URL` over a keep-alive agent and pipes the answer back, status and
 * headers unchanged. No parsing, no authentication, no metering. Its own process.
 */

const upstream = new URL(requiredEnv("UPSTREAM_URL"));
const host = process.env.HOST ?? "127.0.0.1";
const port = Number(process.env.PORT ?? "0");
const agent = new http.Agent({ keepAlive: true, maxSockets: 1024 });

const server = http.createServer({ keepAliveTimeout: 60_000 }, (req, res) => {
  const forward = http.request(
    {
      host: upstream.hostname,
      port: upstream.port,
      method: req.method,
      path: req.url,
      headers: req.headers,
      agent,
    },
    (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      answer.pipe(res);
    },
  );
  forward.on("error", () => {
    if (!res.headersSent) res.writeHead(502, { "content-type": "application/json" });
    res.end();
  });
  // The client went away before the answer was complete: stop the upstream call too.
  res.on("close", () => {
    if (!res.writableFinished) forward.destroy();
  });
  req.pipe(forward);
});
server.headersTimeout = 65_000;

server.listen(port, host, () => {
  const { port: actual } = server.address() as AddressInfo;
  announceReady("proxy", `http://${host}:${actual}`);
});

serveControl(
  () =>
    new Promise<void>((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
      agent.destroy();
    }),
);
