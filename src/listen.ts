import http from "node:http";
import http2 from "node:http2";
import net from "node:net";
import type { Socket } from "node:net";

type Handler = (
  req: http.IncomingMessage | http2.Http2ServerRequest,
  res: http.ServerResponse | http2.Http2ServerResponse,
) => void;

export interface Listener {
  readonly port: number;
  readonly host: string;
  /** Stops accepting, lets requests in flight finish for up to `graceMs`, then cuts the rest. */
  close(graceMs?: number): Promise<void>;
}

const http2Preface = Buffer.from("PRI * HTTP/2.0\r\n");

/**
 * Serves HTTP/1.1 and cleartext HTTP/2 (h2c with prior knowledge, what gRPC
 * clients speak) on one port. Node can only do both on one cleartext port if
 * the server looks at the first bytes: the HTTP/2 connection preface starts
 * with "PRI * HTTP/2.0", which no HTTP/1 request does.
 */
export async function listen(
  handler: Handler,
  options: { host: string; port: number },
): Promise<Listener> {
  const h1 = http.createServer(handler as http.RequestListener);
  h1.keepAliveTimeout = 65_000;
  const h2 = http2.createServer(
    {},
    handler as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void,
  );
  const sockets = new Set<Socket>();
  const sessions = new Set<http2.ServerHttp2Session>();
  h2.on("session", (session) => {
    sessions.add(session);
    session.once("close", () => sessions.delete(session));
  });

  // noDelay: small writes (SSE events, headers) go out at once instead of waiting on Nagle.
  const tcp = net.createServer({ noDelay: true }, (socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
    socket.on("error", () => socket.destroy());
    let head = Buffer.alloc(0);
    const onData = (chunk: Buffer): void => {
      head = Buffer.concat([head, chunk]);
      const probe = Math.min(head.length, http2Preface.length);
      const isHttp2 = head.subarray(0, probe).equals(http2Preface.subarray(0, probe));
      // Wait for more bytes only while they could still be the preface.
      if (isHttp2 && probe < http2Preface.length) return;
      socket.off("data", onData);
      socket.pause();
      socket.unshift(head);
      // HTTP/2 drains the unshifted bytes into its session itself and then
      // reads the native handle; HTTP/1 needs the stream flowing again.
      if (isHttp2) h2.emit("connection", socket);
      else {
        h1.emit("connection", socket);
        socket.resume();
      }
    };
    socket.on("data", onData);
  });

  await new Promise<void>((resolve, reject) => {
    tcp.once("error", reject);
    tcp.listen(options.port, options.host, () => {
      tcp.off("error", reject);
      resolve();
    });
  });
  const address = tcp.address() as net.AddressInfo;

  return {
    port: address.port,
    host: options.host,
    async close(graceMs = 5000) {
      const closed = new Promise<void>((resolve) => tcp.close(() => resolve()));
      for (const session of sessions) session.close();
      h1.closeIdleConnections();
      const deadline = setTimeout(() => {
        for (const socket of sockets) socket.destroy();
      }, graceMs);
      deadline.unref();
      // HTTP/1 sockets that finish their response close once idle.
      const poll = setInterval(() => h1.closeIdleConnections(), 100);
      await closed;
      clearInterval(poll);
      clearTimeout(deadline);
    },
  };
}
