import http from "node:http";
import http2 from "node:http2";
import net from "node:net";
import type { Socket } from "node:net";
import { GatewayError } from "../domain/errors.js";
import { toHttpError } from "../rest/errors.js";
import { errorBodyFor } from "../rest/routes/index.js";

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

/** How long a client may take over each phase of a request, and how much header it may send. */
export interface ListenLimits {
  /**
   * The request headers must arrive within this from the request's first byte (HTTP/1: a
   * client trickling header bytes is cut off, with no answer); also how long a new connection
   * may take to show whether it speaks HTTP/2 (a socket that sends nothing is closed).
   */
  readonly headersTimeoutMs: number;
  /**
   * The request body must arrive within this (HTTP/1: counted with the header phase, from the
   * request's first byte; HTTP/2: from the stream's headers). A late body is answered 408
   * `request_timeout` while no answer has begun. A response being written (an SSE stream) is
   * never timed out: only the request phase is.
   */
  readonly bodyTimeoutMs: number;
  /** An idle kept-alive HTTP/1 connection, or an HTTP/2 session with no open stream, closes after this. */
  readonly idleTimeoutMs: number;
  /** Largest request header block: HTTP/1 `maxHeaderSize` (431 beyond), HTTP/2 `maxHeaderListSize`. */
  readonly maxHeaderBytes: number;
  /**
   * A response with bytes waiting on its client (the writer was told to wait for `drain`, or
   * the response has ended and is still flushing) that sees none of them taken for this long is
   * destroyed: a client that stops reading must not hold the answer's memory, its provider (the
   * relay reads it no faster than the client) or its offer slot forever. The call sees its
   * client leave (a chat is cancelled, billed partial).
   */
  readonly clientWriteTimeoutMs: number;
}

export const defaultListenLimits: ListenLimits = {
  headersTimeoutMs: 10_000,
  bodyTimeoutMs: 30_000,
  idleTimeoutMs: 65_000,
  maxHeaderBytes: 16 * 1024,
  clientWriteTimeoutMs: 30_000,
};

type AnyResponse = http.ServerResponse | http2.Http2ServerResponse;

/**
 * Whether a response waits on its client: bytes are buffered and either its writer was told to
 * wait (`write` returned false) or it has ended and is only flushing.
 */
function waitsOnClient(res: AnyResponse): boolean {
  if (res.writableLength === 0) return false;
  if (res.writableEnded) return true;
  return res instanceof http.ServerResponse
    ? res.writableNeedDrain
    : (res.stream as { writableNeedDrain?: boolean }).writableNeedDrain === true;
}

/**
 * Cuts responses whose client takes nothing for `timeoutMs`: one sweep a second (or a quarter of
 * the timeout) over the responses in flight, no timer or listener per write. A response counts
 * as stalled from the first sweep that finds it waiting on its client and ends being stalled
 * when it drains, when its buffered bytes shrink (the client took some) or when it no longer
 * waits. Bytes leave `writableLength` a whole write at a time (Node shows no partial progress
 * of one write), so a writer that wants a slow reader's progress seen writes in pieces (the
 * REST JSON answer does).
 */
function createWriteWatchdog(timeoutMs: number) {
  const open = new Set<AnyResponse>();
  const stalled = new Map<AnyResponse, { length: number; since: number }>();
  const sweep = (): void => {
    const now = performance.now();
    for (const res of open) {
      if (!waitsOnClient(res)) {
        stalled.delete(res);
        continue;
      }
      const length = res.writableLength;
      const seen = stalled.get(res);
      if (seen === undefined || length < seen.length) {
        stalled.set(res, { length, since: now });
      } else if (now - seen.since >= timeoutMs) {
        stalled.delete(res);
        open.delete(res);
        res.destroy();
        // A writer waiting for `drain` is not told of a destroy (HTTP/2's compatibility response
        // forwards no stream error, and a write already handed to the stream never calls
        // back): connect-node's stream writes would wait forever, and the call with them. Woken,
        // its next write fails at once and the call ends as a client that left.
        res.emit("drain");
      } else seen.length = length;
    }
  };
  const timer = setInterval(sweep, Math.max(20, Math.min(1000, Math.floor(timeoutMs / 4))));
  timer.unref();
  // The client took everything that was waiting: no longer stalled, whatever the writer wrote
  // since (a sweep may never see the moment between a drain and the next full write). One
  // function for every response, no closure per request.
  function drained(this: AnyResponse): void {
    stalled.delete(this);
  }
  function closed(this: AnyResponse): void {
    open.delete(this);
    stalled.delete(this);
  }
  return {
    watch(res: AnyResponse): void {
      open.add(res);
      res.on("drain", drained);
      res.once("close", closed);
    },
    stop: () => clearInterval(timer),
  };
}

/** The 408 body of a request whose body did not arrive in time. */
function requestTimeout(
  limits: ListenLimits,
  target: string | undefined,
): { status: number; payload: string } {
  const { status, body } = toHttpError(
    new GatewayError(
      "request_timeout",
      `the request body did not arrive within ${limits.bodyTimeoutMs} ms`,
    ),
  );
  // A dialect route answers in its own error shape (DESIGN.md section 9).
  return { status, payload: JSON.stringify(errorBodyFor(target, body)) };
}

/** Answers 408 on a response nothing was written to yet, then closes the connection or stream. */
function answerTimeout(
  res: http.ServerResponse | http2.Http2ServerResponse,
  limits: ListenLimits,
  close: () => void,
): void {
  const { status, payload } = requestTimeout(limits, (res as { req?: { url?: string } }).req?.url);
  const headers: Record<string, string | number> = {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(payload),
  };
  if (res instanceof http.ServerResponse) headers.connection = "close";
  res.writeHead(status, headers);
  res.end(payload, close);
}

/**
 * Serves HTTP/1.1 and cleartext HTTP/2 (h2c with prior knowledge, what gRPC
 * clients speak) on one port. Node can only do both on one cleartext port if
 * the server looks at the first bytes: the HTTP/2 connection preface starts
 * with "PRI * HTTP/2.0", which no HTTP/1 request does.
 */
export async function listen(
  handler: Handler,
  options: { host: string; port: number; limits?: Partial<ListenLimits> | undefined },
): Promise<Listener> {
  const limits: ListenLimits = { ...defaultListenLimits, ...options.limits };
  const h1 = createHttp1Server(handler, limits);
  const watchdog = createWriteWatchdog(limits.clientWriteTimeoutMs);
  const { h2, sessions } = createHttp2Server(handler, limits, watchdog);
  const sockets = new Set<Socket>();
  // HTTP/1 requests in flight per connection. Node's own closeIdleConnections() is a no-op
  // here (it tracks only the connections of a server that listens itself, and these are
  // handed over below), so shutdown keeps its own account of which connections are idle.
  const h2Sockets = new WeakSet<Socket>();
  const active = new Map<Socket, number>();
  let inFlight = 0;
  let closing = false;
  /** Ends every HTTP/1 connection with no request in flight (after what it is still writing). */
  const endIdle = (): void => {
    for (const socket of sockets) {
      if (h2Sockets.has(socket) || active.has(socket)) continue;
      socket.end(() => socket.destroy());
    }
  };
  h1.prependListener("request", (req: http.IncomingMessage, res: http.ServerResponse) => {
    const socket = req.socket;
    active.set(socket, (active.get(socket) ?? 0) + 1);
    inFlight++;
    watchdog.watch(res);
    // A request that arrives on a kept-alive connection while closing is its last one.
    if (closing) res.setHeader("connection", "close");
    res.once("close", () => {
      inFlight--;
      const left = (active.get(socket) ?? 1) - 1;
      if (left > 0) active.set(socket, left);
      else active.delete(socket);
      if (closing && inFlight === 0) endIdle();
    });
  });

  const tcp = createSniffingServer({ h1, h2, h2Sockets, sockets, limits });

  await new Promise<void>((resolve, reject) => {
    tcp.once("error", reject);
    tcp.listen(options.port, options.host, () => {
      tcp.off("error", reject);
      resolve();
    });
  });
  const address = tcp.address() as net.AddressInfo;
  // Stops the connection checks Node started on "listening" above, and the write watchdog.
  tcp.once("close", () => {
    h1.close(() => {});
    watchdog.stop();
  });

  return {
    port: address.port,
    host: options.host,
    async close(graceMs = 5000) {
      closing = true;
      const closed = new Promise<void>((resolve) => tcp.close(() => resolve()));
      // HTTP/2 (gRPC): GOAWAY; its streams in flight go on. HTTP/1: with nothing in flight every
      // connection closes now; else kept-alive ones stay until the last response is done, and
      // a request on one meanwhile is answered (the handler's refusal) with Connection: close.
      for (const session of sessions) session.close();
      if (inFlight === 0) endIdle();
      const deadline = setTimeout(() => {
        for (const socket of sockets) socket.destroy();
      }, graceMs);
      deadline.unref();
      await closed;
      clearTimeout(deadline);
    },
  };
}

/**
 * The HTTP/1.1 server, fed connections by the protocol sniffer: Node's header and request
 * deadlines, and the answers to a client's errors (408 for a late body, nothing for slowloris).
 */
function createHttp1Server(handler: Handler, limits: ListenLimits): http.Server {
  const h1 = http.createServer(
    {
      maxHeaderSize: limits.maxHeaderBytes,
      headersTimeout: limits.headersTimeoutMs,
      requestTimeout: limits.headersTimeoutMs + limits.bodyTimeoutMs,
      keepAliveTimeout: limits.idleTimeoutMs,
      // How often Node looks for requests over those deadlines (its default is 30 s).
      connectionsCheckingInterval: Math.max(
        10,
        Math.min(1000, Math.floor(Math.min(limits.headersTimeoutMs, limits.bodyTimeoutMs) / 4)),
      ),
    },
    handler as http.RequestListener,
  );
  // Node enforces headersTimeout and requestTimeout only on the connections of a server that
  // listens itself (its connection list is set up on "listening"); these are handed over from
  // `tcp` below, so the list is set up the same way, and dropped when `tcp` has closed.
  h1.emit("listening");
  h1.on("clientError", (error: NodeJS.ErrnoException, socket: Socket) => {
    const res = (socket as { _httpMessage?: unknown })._httpMessage;
    if (
      error.code === "ERR_HTTP_REQUEST_TIMEOUT" &&
      res instanceof http.ServerResponse &&
      !res.headersSent &&
      socket.writable
    ) {
      // The headers came, the body did not: say so (the handler is still waiting for it).
      answerTimeout(res, limits, () => socket.destroy());
      return;
    }
    // Header phase timed out (slowloris): close without a word. Otherwise Node's own answers.
    if (error.code !== "ERR_HTTP_REQUEST_TIMEOUT" && socket.writable && res === undefined) {
      socket.end(
        error.code === "HPE_HEADER_OVERFLOW"
          ? "HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n\r\n"
          : "HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n",
      );
    }
    socket.destroy();
  });
  return h1;
}

/**
 * The cleartext HTTP/2 server (h2c, gRPC), fed connections by the protocol sniffer: idle
 * sessions close, a request body has its deadline, and the open sessions are kept for shutdown.
 */
function createHttp2Server(
  handler: Handler,
  limits: ListenLimits,
  watchdog: ReturnType<typeof createWriteWatchdog>,
) {
  const h2 = http2.createServer(
    { settings: { maxHeaderListSize: limits.maxHeaderBytes } },
    handler as (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => void,
  );
  // A session is idle when no frame came or went for idleTimeoutMs; one with open streams (a
  // quiet gRPC or SSE stream) stays, one without gets GOAWAY and closes.
  h2.setTimeout(limits.idleTimeoutMs);
  const openStreams = new WeakMap<http2.Http2Session, number>();
  h2.on("stream", (stream: http2.ServerHttp2Stream) => {
    const session = stream.session;
    if (session === undefined) return;
    openStreams.set(session, (openStreams.get(session) ?? 0) + 1);
    stream.once("close", () => openStreams.set(session, (openStreams.get(session) ?? 1) - 1));
  });
  h2.on("timeout", (session: http2.Http2Session) => {
    if ((openStreams.get(session) ?? 0) === 0) session.close();
  });
  // HTTP/2 request bodies: the same deadline, per stream, until the body is in or an answer began.
  h2.prependListener("request", (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => {
    watchdog.watch(res);
    if (req.stream.endAfterHeaders) return; // no body
    const timer = setTimeout(() => {
      if (req.complete || res.headersSent || res.writableEnded) return;
      // The answer is complete; RST_STREAM NO_ERROR tells the client to stop sending.
      answerTimeout(res, limits, () => req.stream.close(http2.constants.NGHTTP2_NO_ERROR));
    }, limits.bodyTimeoutMs);
    timer.unref();
    res.once("close", () => clearTimeout(timer));
  });
  const sessions = new Set<http2.ServerHttp2Session>();
  h2.on("session", (session) => {
    sessions.add(session);
    session.once("close", () => sessions.delete(session));
  });
  return { h2, sessions };
}

/** The TCP server that hands each connection to HTTP/2 or HTTP/1 by its first bytes. */
function createSniffingServer(servers: {
  readonly h1: http.Server;
  readonly h2: http2.Http2Server;
  /** Connections handed to HTTP/2 (the rest are HTTP/1's). */
  readonly h2Sockets: WeakSet<Socket>;
  /** Every connection open. */
  readonly sockets: Set<Socket>;
  readonly limits: ListenLimits;
}): net.Server {
  const { h1, h2, h2Sockets, sockets, limits } = servers;
  // noDelay: small writes (SSE events, headers) go out at once instead of waiting on Nagle.
  const tcp = net.createServer({ noDelay: true }, (socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
    socket.on("error", () => socket.destroy());
    // A connection must show which protocol it speaks in time (one that sends nothing, or
    // trickles the preface, is closed).
    const sniffing = setTimeout(() => socket.destroy(), limits.headersTimeoutMs);
    sniffing.unref();
    socket.once("close", () => clearTimeout(sniffing));
    let head = Buffer.alloc(0);
    const onData = (chunk: Buffer): void => {
      head = Buffer.concat([head, chunk]);
      const probe = Math.min(head.length, http2Preface.length);
      const isHttp2 = head.subarray(0, probe).equals(http2Preface.subarray(0, probe));
      // Wait for more bytes only while they could still be the preface.
      if (isHttp2 && probe < http2Preface.length) return;
      clearTimeout(sniffing);
      socket.off("data", onData);
      socket.pause();
      socket.unshift(head);
      // HTTP/2 drains the unshifted bytes into its session itself and then
      // reads the native handle; HTTP/1 needs the stream flowing again.
      if (isHttp2) {
        h2Sockets.add(socket);
        h2.emit("connection", socket);
      } else {
        h1.emit("connection", socket);
        socket.resume();
      }
    };
    socket.on("data", onData);
  });
  return tcp;
}
